"""Fail-closed loading: an artifact is data, and anything off means fallback (or an error when strict)."""
import json
import warnings

import pytest
import torch

import runtime_loader
from runtime_loader.hardware import differences
from runtime_loader.ops import OPS
from runtime_loader.table import TableError, choose, parse_table

from .tables import ATTN, RMS, entry, provenance, table, write


def load_quietly(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d = runtime_loader.load(path, **kw)
    return d, [str(w.message) for w in caught]


def test_valid_table_loads_without_warnings(tmp_path):
    d, warned = load_quietly(write(tmp_path, table()), strict=True)
    assert not warned
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "torch.rms_norm"
    assert d.kernel_for("rms_norm", torch.randn(9, 64), torch.randn(64)) == "eager.rms_norm"


def test_searched_configuration_in_a_table_is_replayed(tmp_path):
    """A tunable family's configuration id ('demo.rms_norm[rows=64,exact=1]') resolves through the
    registry's grammar and is what the dispatcher calls."""
    import tests.tunable_kernels  # noqa: F401  (registers the CPU family demo.rms_norm)
    kernel_id = "demo.rms_norm[rows=64,exact=1]"
    d, warned = load_quietly(write(tmp_path, table(ops=[entry(RMS, {"kernel_id": kernel_id})])), strict=True)
    x, w = torch.randn(4, 64), torch.randn(64)
    assert not warned and d.kernel_for("rms_norm", x, w) == kernel_id
    torch.testing.assert_close(d.rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))


def test_softcapped_attention_replays_on_its_reference(tmp_path):
    """A softcap (a float static dim) survives the schema, and the signature SDPA cannot compute
    falls back to the reference, not to SDPA."""
    from runtime_loader.ops import Signature
    sig = Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "softcap": 50.0}, ("causal",), "fp32")
    d, warned = load_quietly(write(tmp_path, table(ops=[entry(sig, {"kernel_id": "eager.attention"})])), strict=True)
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert not warned and d.kernel_for("attention", q, k, k, True, None, 0, 50.0) == "eager.attention"
    assert d.kernel_for("attention", q, k, k, True, None, 0, 30.0) == "eager.attention", "outside the table"
    assert d.kernel_for("attention", q, k, k, True) == "sdpa.default"


BAD = {
    "truncated": json.dumps(table())[:-20],
    "not_json": "\x00\x01garbage",
    "top_level_list": json.dumps([table()]),
    "unknown_schema": table(schema_version=99),
    "schema_version_true": table(schema_version=True),  # == 1 to Python
    "no_hardware": table(hardware=None),
    "unknown_kernel": table(ops=[entry(RMS, {"kernel_id": "flashy.rms_norm"})]),
    "import_path_kernel": table(ops=[entry(RMS, {"kernel_id": "os.system"})]),
    "dunder_kernel": table(ops=[entry(RMS, {"kernel_id": "__import__('os').system"})]),
    "config_out_of_domain": table(ops=[entry(RMS, {"kernel_id": "triton.rms_norm[block=3,warps=8]"})]),
    "config_of_unknown_family": table(ops=[entry(RMS, {"kernel_id": "os.system[block=1]"})]),
    "config_reordered": table(ops=[entry(RMS, {"kernel_id": "triton.rms_norm[warps=8,block=4096]"})]),
    "config_zero_padded": table(ops=[entry(RMS, {"kernel_id": "triton.rms_norm[block=04096,warps=8]"})]),
    "config_with_code": table(ops=[entry(RMS, {"kernel_id": "triton.rms_norm[block=__import__('os')]"})]),
    "kernel_for_other_op": table(ops=[entry(RMS, {"kernel_id": "sdpa.math"})]),
    "kernel_lacks_feature": table(ops=[entry(ATTN, {"kernel_id": "sdpa.efficient"})]),  # no GQA
    "split_on_static_dim": table(ops=[entry(RMS, {"dim": "hidden", "threshold": 1, "le": {"kernel_id": "eager.rms_norm"},
                                                  "gt": {"kernel_id": "eager.rms_norm"}})]),
    "nan_threshold": table(ops=[entry(RMS, {"dim": "tokens", "threshold": float("nan"),
                                            "le": {"kernel_id": "eager.rms_norm"}, "gt": {"kernel_id": "eager.rms_norm"}})]),
    "string_threshold": table(ops=[entry(RMS, {"dim": "tokens", "threshold": "8",
                                               "le": {"kernel_id": "eager.rms_norm"}, "gt": {"kernel_id": "eager.rms_norm"}})]),
    "unknown_op": table(ops=[{"op": "os.system", "static": {}, "dtype": "fp32", "tree": {"kernel_id": "eager.rms_norm"}}]),
    "wrong_static": table(ops=[{"op": "norm.rms", "static": {"width": 3}, "dtype": "fp32",
                                "tree": {"kernel_id": "eager.rms_norm"}}]),
    "other_gpu": table(hardware={**table()["hardware"], "device": "cuda", "name": "NVIDIA B200", "sm": 100}),
    "other_isa": table(hardware={**table()["hardware"], "isa": "VSX"}),
}


@pytest.mark.parametrize("case", BAD)
def test_untrustworthy_tables_fall_back(tmp_path, case):
    path = write(tmp_path, BAD[case] if isinstance(BAD[case], str) else json.dumps(BAD[case]))
    d, warned = load_quietly(path)
    assert len(warned) == 1 and "every call uses the fallback" in warned[0]
    assert d.table is None
    x = torch.randn(4, 64)
    assert d.kernel_for("rms_norm", x, torch.randn(64)) == "eager.rms_norm"
    with pytest.raises(TableError):
        runtime_loader.load(path, strict=True)


def test_deep_tree_is_refused():
    node = {"kernel_id": "eager.rms_norm"}
    for _ in range(40):
        node = {"dim": "tokens", "threshold": 1.0, "le": node, "gt": node}
    with pytest.raises(TableError, match="deeper"):  # shared subtrees: 2^40 paths if walked naively
        parse_table(table(ops=[entry(RMS, node)], kernels=provenance({"eager.rms_norm"})))


@pytest.mark.parametrize("splits", [20, 31, 32])
def test_a_tree_of_up_to_32_levels_is_accepted(splits):
    """Trees may be MAX_TREE_DEPTH deep: the schema's own depth bound, counted in its recursion
    (three levels per node), refused 20 splits on one path as "missing 'kernel_id'" (issue 55)."""
    from runtime_loader.table import MAX_TREE_DEPTH
    node = {"kernel_id": "eager.rms_norm"}
    for i in range(splits):
        node = {"dim": "tokens", "threshold": float(i), "le": {"kernel_id": "torch.rms_norm"}, "gt": node}
    assert splits <= MAX_TREE_DEPTH
    t = parse_table(table(ops=[entry(RMS, node)]))
    assert choose(t.trees[RMS], {"tokens": -1}) == "torch.rms_norm"
    assert choose(t.trees[RMS], {"tokens": splits}) == "eager.rms_norm"


def test_a_tree_past_32_levels_is_refused():
    node = {"kernel_id": "eager.rms_norm"}
    for i in range(33):
        node = {"dim": "tokens", "threshold": float(i), "le": {"kernel_id": "eager.rms_norm"}, "gt": node}
    with pytest.raises(TableError, match="deeper"):
        parse_table(table(ops=[entry(RMS, node)]))


def test_missing_artifact(tmp_path):
    with pytest.raises(TableError, match="no artifact folder at .*nothing"):
        runtime_loader.load(tmp_path / "nothing", strict=True)
    d, warned = load_quietly(tmp_path / "nothing")
    assert d.table is None and "no artifact folder" in d.load_error and "no artifact folder" in warned[0]


def other_library_kernel():
    """A CPU kernel of a library other than torch (registered for this module only: conftest)."""
    from runtime_loader import registry
    from runtime_loader.ops.norm import rms_norm
    from runtime_loader.specs import KernelSpec
    if not registry.known("plugin.rms_norm"):
        registry.register(KernelSpec("plugin.rms_norm", frozenset({"norm.rms"}), "plugin-lib", rms_norm,
                                     platforms=frozenset({"cpu"}), dtypes=frozenset({"fp32"})))
    return "plugin.rms_norm"


def test_a_table_from_another_torch_keeps_the_entries_of_other_libraries(tmp_path):
    """Partial revalidation: a torch upgrade drops the entries torch's kernels serve (they were
    measured under the old torch) and keeps those of other libraries, each with its reason."""
    kernel = other_library_kernel()
    raw = table(ops=[entry(RMS, {"kernel_id": kernel}), entry(ATTN, {"kernel_id": "sdpa.math"})])
    raw["hardware"]["torch"] = "1.0.0"
    raw["kernels"]["sdpa.math"]["version"] = "1.0.0"
    d, warned = load_quietly(write(tmp_path, raw), strict=True)
    assert d.table is not None and len(warned) == 1 and "sdpa.math is not used (torch is" in warned[0]
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == kernel, "another library's entry serves"
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert d.kernel_for("attention", q, k, k) == "sdpa.default", "torch's entry falls back"
    entries = d.explain()["entries"]
    assert entries[str(RMS)]["served"] and not entries[str(ATTN)]["served"]
    assert "torch is" in entries[str(ATTN)]["kernels"]["sdpa.math"] and "1.0.0" in entries[str(ATTN)]["why"]
    assert d.explain("attention.prefill", hq=4, hkv=2, d=16, flags=("causal",), dtype="fp32", batch=1,
                     seq=8)["reason"] == "no kernel of the leaf is usable here"


def test_a_change_of_software_drops_the_kernels_it_touches():
    from runtime_loader import registry
    from runtime_loader.hardware import stale_under
    stack = {"triton": ("3.0.0", "3.6.0")}
    assert stale_under(registry.get("liger.rms_norm"), stack) and stale_under(registry.get("compile.rms_norm"), stack)
    assert stale_under(registry.get("triton.rms_norm"), stack)
    assert not stale_under(registry.get("sdpa.cudnn"), stack) and not stale_under(registry.get("eager.rms_norm"), stack)
    assert stale_under(registry.get("eager.rms_norm"), {"cudnn": (90100, 91900)}), "cuDNN: every CUDA kernel"
    assert stale_under(registry.get("flashinfer.decode"), {"cuda": ("12.8", "13.0")}), "CUDA: every CUDA kernel"
    assert not stale_under(registry.get("sdpa.cpu_flash"), {"cuda": ("12.8", "13.0")}), "a CPU-only kernel"
    assert not stale_under(registry.get("flashinfer.decode"), {"torch": ("2.11.0", "2.13.0")}), "another library"


def test_a_table_of_another_device_model_is_borrowed_only_when_asked(tmp_path):
    raw = table(hardware={**table()["hardware"], "name": "Another CPU of this architecture"})
    path = write(tmp_path, raw)
    d, warned = load_quietly(path)
    assert d.table is None and "allow_similar_gpu=True" in warned[0] and "another device" in d.load_error
    d, warned = load_quietly(path, allow_similar_gpu=True)
    assert d.table is not None and len(warned) == 1 and "borrowing a table tuned on another device" in warned[0]
    assert "--on-this-gpu" in warned[0]
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "torch.rms_norm"
    other = write(tmp_path / "isa", table(hardware={**table()["hardware"], "isa": "VSX"}))
    assert load_quietly(other, allow_similar_gpu=True)[0].table is None, "another architecture: never"


def test_a_tables_named_fallbacks_are_never_served(tmp_path):
    """fallback_policy names each op's fallback for a reader: a forged one (a kernel that skips the
    normalisation) serves nothing; a call outside the table takes the registry's fallback."""
    import tests.tunable_kernels  # noqa: F401  (demo.rms_norm[...,exact=0] skips the normalisation)
    forged = {"outside_table": "fallback", "fallbacks": {"norm.rms": "demo.rms_norm[rows=64,exact=0]"}}
    d, warned = load_quietly(write(tmp_path, table(fallback_policy=forged)), strict=True)
    x = torch.randn(4, 32)  # hidden 32: a signature the table does not hold
    assert d.kernel_for("rms_norm", x, torch.randn(32)) == OPS["norm.rms"].fallback and not warned


def test_a_cpu_table_of_another_host_architecture_is_refused_even_when_borrowing(tmp_path):
    here = table()["hardware"]
    foreign = "aarch64" if here["arch"] != "aarch64" else "x86_64"
    path = write(tmp_path, table(hardware={**here, "arch": foreign}))  # same ISA name, same CPU name
    d, warned = load_quietly(path, allow_similar_gpu=True)
    assert d.table is None and f"arch: table '{foreign}'" in d.load_error


def test_a_gpu_tables_host_architecture_is_the_models_kind_of_difference():
    gpu = {"device": "cuda", "name": "NVIDIA H100 80GB HBM3", "sm": 90, "isa": None, "arch": "x86_64"}
    seen = differences(gpu, {**gpu, "arch": "aarch64"})
    assert not seen.refused and seen.borrowed == ["arch: table 'x86_64' vs here 'aarch64'"]


def test_verify_drops_a_kernel_that_disagrees_with_its_fallback(tmp_path):
    import tests.tunable_kernels  # noqa: F401  (demo.rms_norm[...,exact=0] skips the normalisation)
    wrong = "demo.rms_norm[rows=64,exact=0]"
    tree = {"dim": "tokens", "threshold": 8.0, "le": {"kernel_id": "torch.rms_norm"}, "gt": {"kernel_id": wrong}}
    path = write(tmp_path, table(ops=[entry(RMS, tree)]))
    d, warned = load_quietly(path, strict=True)
    assert not warned and d.kernel_for("rms_norm", torch.randn(16, 64), torch.randn(64)) == wrong, "unverified"
    d, warned = load_quietly(path, verify=True)
    assert len(warned) == 1 and "verify dropped 1 kernels" in warned[0] and "PARITY_FAILED" in warned[0]
    assert d.kernel_for("rms_norm", torch.randn(16, 64), torch.randn(64)) == "eager.rms_norm"
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "torch.rms_norm", "the right one kept"
    assert "PARITY_FAILED" in d.explain()["entries"][str(RMS)]["kernels"][wrong]
    with pytest.raises(TableError, match="verify: 1 kernels disagree"):
        runtime_loader.load(path, strict=True, verify=True)


def test_verify_drops_what_it_cannot_reach_in_its_budget(tmp_path):
    d = runtime_loader.load(write(tmp_path, table()), strict=True)
    dropped = d.verify(budget_s=0)
    assert dropped and all("not verified within 0 s" in why for why in dropped.values())
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "eager.rms_norm"


def test_checksum_mismatch_is_refused(tmp_path):
    path = write(tmp_path, table())
    raw = json.loads((tmp_path / "dispatch.json").read_text())
    raw["ops"][0]["tree"]["le"]["kernel_id"] = "eager.rms_norm"  # a valid table, but not the one hashed
    (tmp_path / "dispatch.json").write_text(json.dumps(raw))
    d, warned = load_quietly(path)
    assert d.table is None and "checksum mismatch for dispatch.json" in warned[0]


def test_missing_manifest_is_refused(tmp_path):
    d, warned = load_quietly(write(tmp_path, table(), manifest=False))
    assert d.table is None and "no manifest.json" in warned[0]


def test_manifest_cannot_point_outside(tmp_path):
    from runtime_loader.manifest import read_manifest, verify
    write(tmp_path, table())
    with pytest.raises(TableError, match="leaves the artifact"):
        verify(tmp_path, read_manifest(tmp_path), "../outside.json")


def test_stale_kernel_uses_the_fallback_not_the_table(tmp_path):
    raw = table()
    raw["kernels"]["sdpa.math"]["version"] = "0.0.1"  # measured with another torch
    d, warned = load_quietly(write(tmp_path, raw))
    assert d.table is not None, "one stale kernel does not void the whole table"
    assert any("sdpa.math is not used" in w and "0.0.1" in w for w in warned)
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    assert d.kernel_for("attention", q, k, k) == "sdpa.default"
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "torch.rms_norm"


def test_redeclared_kernel_uses_the_fallback(tmp_path):
    raw = table()
    raw["kernels"]["torch.rms_norm"]["capabilities"] = "0" * 64
    d, warned = load_quietly(write(tmp_path, raw))
    assert any("declared capabilities changed" in w for w in warned)
    assert d.kernel_for("rms_norm", torch.randn(4, 64), torch.randn(64)) == "eager.rms_norm"


def test_schema_violation_names_the_field(tmp_path):
    raw = table()
    del raw["fallback_policy"]
    with pytest.raises(TableError, match="missing 'fallback_policy'"):
        runtime_loader.load(write(tmp_path, raw), strict=True)
