"""Kernel specs and the capability gate; the registry."""
import dataclasses
import sys

import pytest

from runtime_loader import registry, specs
from runtime_loader.ops import OPS, Signature
from runtime_loader.specs import HEAD_DIM_ANY, DeviceInfo, KernelSpec

ATTN = Signature.make("attention.prefill", {"hq": 8, "hkv": 1, "d": 128}, ("causal",), "bf16")
H100 = DeviceInfo("cuda", 90)


def spec(**overrides):
    base = KernelSpec("test.k", frozenset({"attention.prefill"}), "torch", lambda *a: None,
                      platforms=frozenset({"cuda"}), min_sm=80, dtypes=frozenset({"bf16"}), head_dim_max=256,
                      head_dim_multiple=8, features=frozenset({"causal", "gqa"}))
    return dataclasses.replace(base, **overrides)


def codes(reasons):
    return [r.code for r in reasons]


def test_a_library_for_another_platform_is_looked_for_not_imported(tmp_path, monkeypatch, fresh_import_verdicts):
    """On a CPU a CUDA kernel's library is not imported (Helion's import takes seconds): it is
    found, or NOT_INSTALLED; where the kernel could run, a library that fails its import says so."""
    (tmp_path / "lz_breaks_on_import.py").write_text("raise RuntimeError('no CUDA here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = spec(requires=("lz_breaks_on_import",))
    assert codes(kernel.local_reasons(DeviceInfo("cpu"))) == ["PLATFORM_MISMATCH"]
    assert "lz_breaks_on_import" not in sys.modules
    assert codes(kernel.local_reasons(H100)) == ["BACKEND_IMPORT_FAILED"]
    missing = spec(requires=("surely_not_a_module_xyz",))
    assert codes(missing.local_reasons(DeviceInfo("cpu"))) == ["NOT_INSTALLED", "PLATFORM_MISMATCH"]


def test_admitted_when_everything_is_declared():
    assert spec().check(ATTN, H100) == []


@pytest.mark.parametrize("overrides,device,code", [
    ({}, DeviceInfo("cpu"), "PLATFORM_MISMATCH"),
    ({}, DeviceInfo("cuda", 75), "SM_TOO_OLD"),
    ({"max_sm": 89}, H100, "SM_TOO_NEW"),
    ({"dtypes": frozenset({"fp16"})}, H100, "DTYPE_UNSUPPORTED"),
    ({"head_dim_max": 64}, H100, "HEAD_DIM_UNSUPPORTED"),
    ({"head_dim_multiple": 48}, H100, "HEAD_DIM_UNSUPPORTED"),
    ({"features": frozenset({"causal"})}, H100, "FEATURE_UNSUPPORTED:gqa"),
    ({"ops": frozenset({"attention.decode"})}, H100, "OP_UNSUPPORTED"),
    ({"requires": ("surely_not_a_module_xyz",)}, H100, "NOT_INSTALLED"),
])
def test_each_missing_capability_is_a_reason(overrides, device, code):
    assert code in codes(spec(**overrides).check(ATTN, device))


@pytest.mark.parametrize("load", [True, False])
def test_a_missing_library_names_the_distribution_to_install(load):
    """The hint names the kernel's own distribution: the FA2 kernel's said `pip install lzsolve[gpu]`,
    an extra without flash-attn, of a package on no index."""
    missing = spec(library="flash-attn", requires=("surely_not_a_module_xyz",)).installed(load)
    assert (missing.code, missing.message) == (
        "NOT_INSTALLED", "python module 'surely_not_a_module_xyz' is not installed (pip install flash-attn)")


@pytest.mark.parametrize("module", ["surely_not_a_package_xyz.cute", "json.surely_not_a_module_xyz"])
def test_a_missing_submodule_is_not_installed_not_an_import_failure(module):
    """FA4's module is flash_attn.cute: without its package, or beside FA2's flash_attn without it,
    the kernel is NOT_INSTALLED (find_spec of a dotted name raised where the parent was missing)."""
    missing = spec(library="flash-attn-4", requires=(module,)).installed()
    assert (missing.code, missing.message) == (
        "NOT_INSTALLED", f"python module '{module}' is not installed (pip install flash-attn-4)")


def test_missing_fields_mean_unsupported():
    bare = KernelSpec("bare", frozenset({"attention.prefill"}), "torch", lambda *a: None)
    got = codes(bare.check(ATTN, H100))
    assert {"PLATFORM_MISMATCH", "DTYPE_UNSUPPORTED", "HEAD_DIM_UNSUPPORTED",
            "FEATURE_UNSUPPORTED:causal", "FEATURE_UNSUPPORTED:gqa"} <= set(got)


def test_registry_covers_every_op_with_its_fallback():
    for op, _schema in OPS.items():
        fallback = registry.fallback(op)
        assert op in fallback.ops
        assert fallback.platforms >= {"cpu", "cuda"}, f"{op}'s fallback must run everywhere"
        assert fallback.head_dim_max in (0, HEAD_DIM_ANY)
    with pytest.raises(KeyError):
        registry.get("os.system")


def test_sdpa_efficient_declares_no_gqa():
    assert "FEATURE_UNSUPPORTED:gqa" in codes(registry.get("sdpa.efficient").check(ATTN, H100))
    mha = Signature.make("attention.prefill", {"hq": 8, "hkv": 8, "d": 128}, ("causal",), "bf16")
    assert registry.get("sdpa.efficient").check(mha, H100) == []


def test_capabilities_hash_tracks_declarations(monkeypatch):
    before = registry.capabilities_hash()
    assert before == registry.capabilities_hash()
    changed = dataclasses.replace(registry.REGISTRY["sdpa.flash"], head_dim_max=128)
    monkeypatch.setitem(registry.REGISTRY, "sdpa.flash", changed)
    assert registry.capabilities_hash() != before


def test_a_librarys_version_is_read_once_per_process(monkeypatch):
    """A tune asks every record's kernel version; importlib.metadata parses the package's files on
    each call (5 ms on the H100 host, from every device's thread in turn): once is enough."""
    import importlib.metadata

    reads = []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: reads.append(name) or "1.2.3")
    specs.library_version.cache_clear()
    try:
        versions = {dataclasses.replace(spec(), library="somelib").version() for _ in range(3)}
    finally:
        specs.library_version.cache_clear()  # the fake's answer must not outlive this test
    assert len(versions) == 1 and versions.pop().startswith("1.2.3") and reads == ["somelib"]


# torch.__version__ and the distribution's version (importlib.metadata) of the builds pip serves: PyPI's
# CUDA wheel says its local tag in the first alone (issue 55: the README's test command failed on a
# fresh machine with it, while CI installs the CPU wheel, where the two agree)
TORCH_BUILDS = {
    "pypi_cuda": ("2.13.0+cu130", "2.13.0"),
    "index_cuda": ("2.13.0+cu130", "2.13.0+cu130"),
    "cpu": ("2.13.0+cpu", "2.13.0+cpu"),
    "rocm": ("2.13.0+rocm6.2", "2.13.0+rocm6.2"),
    "plain": ("2.13.0", "2.13.0"),
}


@pytest.fixture(params=sorted(TORCH_BUILDS))
def torch_build(request, monkeypatch):
    """This process as if torch were each build: torch.__version__ and the distribution's version,
    where the code reads them. Yields the distribution's version."""
    import importlib.metadata

    import torch

    version, distribution = TORCH_BUILDS[request.param]
    real = importlib.metadata.version
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: distribution if name == "torch" else real(name))
    specs.library_version.cache_clear()
    yield distribution
    specs.library_version.cache_clear()  # the fake's answer must not outlive the test


def test_a_kernels_version_covers_the_source_behind_it(tmp_path, torch_build):
    """What a record measured is the library and this project's code around it: a kernel whose
    adapter or Triton module changed gets another version, so the tuner measures it again and a
    table of the old code is stale (on the H100 an edited MoE kernel kept its old records)."""
    import importlib.util
    from pathlib import Path

    from runtime_loader.kernels.triton_ops import DeferredKernel
    from runtime_loader.specs import source_digest, source_files

    def load(name, text):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.f

    first, edited = load("adapter_a", "def f(x):\n    return x\n"), load("adapter_b", "def f(x):\n    return x + 0\n")
    assert source_digest(first) and source_digest(first) != source_digest(edited)
    rms = registry.get("eager.rms_norm")
    assert rms.version() == f"{torch_build}+src.{source_digest(rms.impl)}", "the distribution's version, as installed"
    assert dataclasses.replace(rms, impl=edited).version() != dataclasses.replace(rms, impl=first).version()
    compiled = registry.get("compile.rms_norm")
    assert {Path(f).name for f in source_files(compiled.impl)} == {"compile_ops.py", "norm.py"}, "the eager code (runtime_loader.ops.norm) too"
    deferred = registry.get("triton.rms_norm").impl
    assert isinstance(deferred, DeferredKernel) and source_files(deferred) == (str(deferred.source_file),)


def test_the_version_paths_agree_under_every_build_of_torch(tmp_path, torch_build):
    """Every path that reads torch's version, under each build: the hardware signature and its slug
    (torch's public version; the build is the signature's cuda field), each kernel's version in a
    table's provenance, a strict load of a table written under that build, a tune's records, and
    `lzsolve kernels`."""
    import json

    import torch
    from click.testing import CliRunner

    import runtime_loader
    from lzsolve.cli import cli
    from lzsolve.measure.tuner import Recorder
    from runtime_loader.hardware import hardware_signature, slug

    from .tables import table, write

    signature = hardware_signature("cpu")
    assert signature["torch"] == "2.13.0" and slug(signature).endswith("-torch2.13.0")
    raw = table()
    assert {k["version"].rsplit("+src.", 1)[0] for k in raw["kernels"].values()} == {torch_build}
    assert runtime_loader.load(write(tmp_path / "artifact", raw), strict=True).table is not None
    recorder = Recorder("m", 1, "fp32", torch.device("cpu"), signature, "run", "cpu")
    assert recorder.common["torch_version"] == torch.__version__ and recorder.hw_slug == slug(signature)
    result = CliRunner().invoke(cli, ["kernels", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    versions = {row["kernel_id"]: row["version"] for row in map(json.loads, result.output.splitlines())}
    assert versions["eager.rms_norm"] == registry.get("eager.rms_norm").version()
    assert versions["eager.rms_norm"].startswith(f"{torch_build}+src.")


def test_a_configuration_names_its_family_and_the_default_is_the_familys_kernel():
    from runtime_loader.specs import config_id
    family = registry.TUNABLES["triton.rms_norm"]
    default, other = family.default, {**family.default, "warps": next(w for w in family.params["warps"]
                                                                       if w != family.default["warps"])}
    assert registry.family(config_id("triton.rms_norm", other)) == "triton.rms_norm" == registry.family("triton.rms_norm")
    assert registry.plain_id(config_id("triton.rms_norm", default)) == "triton.rms_norm"
    assert registry.plain_id(config_id("triton.rms_norm", other)) == config_id("triton.rms_norm", other)
    assert registry.family("nope.rms_norm[block=1]") == "nope.rms_norm[block=1]", "not a family: its own id"
    assert registry.plain_id("eager.rms_norm") == "eager.rms_norm" == registry.family("eager.rms_norm")
