"""lzsolve's Triton kernel families: declarations, search spaces, and CPU parity through the
Triton interpreter (GPU parity and speed are checked by tests/test_kernels.py's gpu test)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runtime_loader import registry
from runtime_loader.kernels import ALL_TUNABLES

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
FAMILIES = {t.base_id: t for t in ALL_TUNABLES}  # every built-in family: ours, and FLA's chunk sizes


def run_python(*args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_kernels_agree_with_the_references_in_the_interpreter():
    pytest.importorskip("triton")
    result = run_python("-m", "tests.triton_interpret_check", env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


@pytest.mark.parametrize("base_id", sorted(FAMILIES))
def test_search_space_fits_its_family(base_id):
    family = FAMILIES[base_id]
    space = yaml.safe_load((SPACES / f"{base_id}.yaml").read_text())
    assert space["kernel"] == base_id
    assert isinstance(space["trials"], int) and space["trials"] >= 1
    assert list(space["params"]) == list(family.params)
    for name, values in space["params"].items():
        assert values and set(values) <= set(family.params[name]), f"{name}: {values} outside the kernel's domain"
        assert family.default[name] in values, f"{name}: the default {family.default[name]} is not searched"
    family.check(family.default)


def test_every_search_space_names_a_family():
    assert {path.name.removesuffix(".yaml") for path in SPACES.glob("*.yaml")} == set(FAMILIES)


def test_configurations_resolve_by_id():
    spec = registry.get("triton.rms_norm[block=1024,warps=4]")
    assert spec.kernel_id == "triton.rms_norm[block=1024,warps=4]" and callable(spec.impl)
    assert registry.get("triton.rms_norm") is registry.REGISTRY["triton.rms_norm"]  # the default configuration
    for bad in ("triton.rms_norm[block=1000,warps=4]",  # not a power of two
                "triton.rms_norm[block=1048576,warps=4]",  # beyond the domain
                "triton.rms_norm[warps=4,block=1024]",  # parameters out of order
                "triton.rms_norm[block=1024]",
                "triton.linear[block_m=128,block_n=128,block_k=64,warps=8,stages=3,split_k=3]"):
        with pytest.raises(KeyError):
            registry.get(bad)


def test_runtime_imports_and_resolves_ids_without_triton():
    """A table naming these kernels must load where triton is missing: the kernel is then
    NOT_INSTALLED, a Reason, not an ImportError."""
    script = ("import sys; sys.modules['triton'] = None\n"  # makes `import triton` fail, as if not installed
              "from runtime_loader import registry\n"
              "spec = registry.get('triton.linear[block_m=64,block_n=128,block_k=64,warps=4,stages=4,split_k=1]')\n"
              "print(spec.installed().code)")
    result = run_python("-c", script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "NOT_INSTALLED"


def test_row_tile_is_the_block_or_the_rows_own_power_of_two():
    from runtime_loader.kernels.triton_ops.layout import row_tile
    assert [row_tile(n, 8192) for n in (1, 2, 320, 2304, 4096, 8192, 8193, 16384)] == \
        [1, 2, 512, 4096, 4096, 8192, 8192, 8192]
    assert row_tile(320, 256) == 256  # a row wider than the block: chunks of the block


@pytest.mark.parametrize("site", ["rms_norm", "rms_norm_add", "layer_norm"])
def test_a_row_narrower_than_the_block_is_one_tile_of_its_own_width(monkeypatch, site):
    """The default block (8192) must not make hidden 320 a 8192-lane tile, nor a block of 256 one tile."""
    pytest.importorskip("triton")
    import torch

    from runtime_loader.kernels.triton_ops import norm
    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: launched.append((options["BLOCK"], options["ONE_TILE"]))

    kernel = "_layer_norm_kernel" if site == "layer_norm" else "_rms_norm_kernel"
    monkeypatch.setattr(norm, kernel, Recorder())
    x, weight = torch.randn(3, 320), torch.ones(320)
    for block in (8192, 256):
        if site == "rms_norm":
            norm.rms_norm(x, weight, 1e-6, block=block, warps=8)
        elif site == "rms_norm_add":
            norm.rms_norm_add(x, x.clone(), weight, 1e-6, keep_inputs=True, block=block, warps=8)
        else:
            norm.layer_norm(x, weight, torch.zeros(320), 1e-6, block=block, warps=8)
    assert launched == [(512, True), (256, False)]
