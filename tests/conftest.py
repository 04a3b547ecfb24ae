import dataclasses
import math
import os
import shutil
import sys

import pytest
import torch

# Keep CPU tests quick and quiet on 2-core machines.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Under pytest-xdist (the README's test command: a worker per CPU) each worker, and each process its
# tests start, takes its share of the CPUs: torch's threads per process at the CPU count,
# oversubscribed by the workers, spin against each other.
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# No test reads or fills the user's measurement cache (nor one test another's, through it): the tests
# of the cache name theirs (MeasureConfig.cache_dir, tune --cache-dir). Inherited by the commands and
# worker processes the tests start.
os.environ["LZSOLVE_CACHE"] = "off"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def registry_restored():
    """Kernels a module registers (tests.faulty_kernels' fault.*, a --plugin's, a test's own) stay in
    the registry while that module runs only: a later module's in-process tune plans every
    registered kernel, and its worker processes, which know none of these, answered each with a
    KeyError: after test_hardening imported fault.*, test_integrations' 14 s tune took 117 s.
    The helper modules it imported are forgotten too, so that a later import registers again."""
    from runtime_loader import registry

    tables = [registry.REGISTRY, registry.TUNABLES, registry._CONFIGURED]
    saved, helpers = [dict(t) for t in tables], {name for name in sys.modules if name.startswith("tests.")}
    yield
    for table, entries in zip(tables, saved):
        table.clear()
        table.update(entries)
    for name in [n for n in sys.modules if n.startswith("tests.") and n not in helpers]:
        sys.modules.pop(name)
        vars(sys.modules["tests"]).pop(name.split(".", 1)[1], None)  # `from . import x` looks here first


@pytest.fixture
def restore_active():
    """After a test that patches models: tables.unpatch()."""
    yield
    from .tables import unpatch
    unpatch()


@pytest.fixture
def fresh_import_verdicts():
    """The gate's cached answers on which libraries are there and import, cleared before and after:
    a test that plants a fake library leaves no verdict about it behind."""
    from runtime_loader import specs
    caches = (specs._import_reason, specs._find_reason)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.fixture(scope="session")
def tiny_llama_artifact(tmp_path_factory):
    """One CPU tune of a tiny Llama (tiny grid, fp32, torch.compile left out, default validation,
    probes at every probe point, quick sampling), in this process, shared by the tests that read an
    artifact (they may add evaluation records). Every point is probed (tuner.PROBE_CLEAR) so that
    the artifact has probe records whichever races the VM's noise makes close. Under pytest-xdist
    the first worker to ask tunes it and each worker reads a copy of its own (their tests add records)."""
    from filelock import FileLock

    from lzsolve.measure import tuner
    from lzsolve.pipeline import ModelSource, ValidateConfig
    from tests.tables import NO_COMPILE, plugin_kernels, tuned
    from tests.test_cli import tiny_llama_config

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    root = shared / "tiny-artifact"
    with FileLock(str(shared / "tiny-artifact.lock")):
        if not (root / "done").exists():
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(tuner, "PROBE_CLEAR", math.inf)
                tuned(ModelSource(config=tiny_llama_config(root), dtype="fp32"), root / "artifact",
                      dataclasses.replace(NO_COMPILE, exclude=NO_COMPILE.exclude + plugin_kernels()),
                      validate=ValidateConfig())
            (root / "done").touch()
    if shared == base:
        return root / "artifact"
    own = tmp_path_factory.mktemp("tiny-artifact")
    shutil.copytree(root / "artifact", own / "artifact", symlinks=True)
    return own / "artifact"


@pytest.fixture
def probes_everywhere(monkeypatch):
    """Every probe point timed, however clear the lead at the buckets around it (tuner.PROBE_CLEAR):
    which races of a tiny CPU tune are close is up to the VM's noise; tiny_llama_artifact was tuned
    so, and a re-run of it must be too to find every record it needs."""
    from lzsolve.measure import tuner
    monkeypatch.setattr(tuner, "PROBE_CLEAR", math.inf)
