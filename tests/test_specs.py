"""Kernel specs and the capability gate; the registry."""
import dataclasses

import pytest

from runtime_loader import registry
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


def test_missing_fields_mean_unsupported():
    bare = KernelSpec("bare", frozenset({"attention.prefill"}), "torch", lambda *a: None)
    got = codes(bare.check(ATTN, H100))
    assert {"PLATFORM_MISMATCH", "DTYPE_UNSUPPORTED", "HEAD_DIM_UNSUPPORTED",
            "FEATURE_UNSUPPORTED:causal", "FEATURE_UNSUPPORTED:gqa"} <= set(got)


def test_registry_covers_every_op_with_its_fallback():
    for op, schema in OPS.items():
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

    from runtime_loader import specs

    reads = []
    monkeypatch.setattr(importlib.metadata, "version", lambda name: reads.append(name) or "1.2.3")
    specs.library_version.cache_clear()
    try:
        versions = {dataclasses.replace(spec(), library="somelib").version() for _ in range(3)}
    finally:
        specs.library_version.cache_clear()  # the fake's answer must not outlive this test
    assert len(versions) == 1 and versions.pop().startswith("1.2.3") and reads == ["somelib"]


def test_a_kernels_version_covers_the_source_behind_it(tmp_path):
    """What a record measured is the library and this project's code around it: a kernel whose
    adapter or Triton module changed gets another version, so the tuner measures it again and a
    table of the old code is stale (on the H100 an edited MoE kernel kept its old records)."""
    import importlib.util
    from pathlib import Path

    import torch

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
    assert rms.version().startswith(torch.__version__ + "+src.")
    assert dataclasses.replace(rms, impl=edited).version() != dataclasses.replace(rms, impl=first).version()
    compiled = registry.get("compile.rms_norm")
    assert {Path(f).name for f in source_files(compiled.impl)} == {"compiled.py", "eager.py"}, "the eager code too"
    deferred = registry.get("triton.rms_norm").impl
    assert isinstance(deferred, DeferredKernel) and source_files(deferred) == (str(deferred.source_file),)
