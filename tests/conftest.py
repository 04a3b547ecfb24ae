import os

import pytest
import torch

# Keep CPU tests quick and quiet on 2-core machines.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def restore_active():
    """After a test that patches models: tables.unpatch()."""
    yield
    from .tables import unpatch
    unpatch()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def tiny_llama_artifact(tmp_path_factory):
    """One CPU tune of a tiny Llama (tiny grid, fp32, torch.compile left out, default probes and
    validation, quick sampling), shared by the tests that read an artifact (they may add evaluation records)."""
    from click.testing import CliRunner

    from lzsolve.cli import cli
    from tests.tables import QUICK
    from tests.test_cli import tiny_llama_config

    root = tmp_path_factory.mktemp("tiny-artifact")
    out = root / "artifact"
    result = CliRunner().invoke(cli, ["tune", "--config", str(tiny_llama_config(root)), "--grid", "tiny", "--dtype",
                                      "fp32", "--device", "cpu", "--exclude", "compile.*", "--out", str(out), *QUICK])
    assert result.exit_code == 0, result.output
    return out
