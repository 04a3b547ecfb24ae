"""Adapters of optional libraries (Liger-Kernel, FlashAttention 4, 3 and 2, QuACK) and FlexAttention, on CPU.

The libraries themselves run only on the GPU machine (tests/test_kernels.py's GPU parity test
covers them there); here: their capability gates, the layout plumbing of each adapter (with a
stand-in library where the real one needs CUDA), Flex's per-shape compile cache, and Liger's
kernels through the Triton interpreter when liger_kernel is installed.
"""
import importlib.util
import json
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lzsolve.ops import CONTRACTS, compare, to_fp32
from runtime_loader import registry
from runtime_loader.kernels import flash_attn, flex, liger, quack
from runtime_loader.ops import Signature
from runtime_loader.specs import DeviceInfo

ROOT = Path(__file__).resolve().parents[1]
H100 = DeviceInfo("cuda", 90)
CPU = torch.device("cpu")
PREFILL = Signature.make("attention.prefill", {"hq": 8, "hkv": 2, "d": 128}, ("causal",), "bf16")
DECODE = Signature.make("attention.decode", {"hq": 8, "hkv": 2, "d": 128}, (), "bf16")

# A signature each kernel should admit on an H100, so that a missing library is its only reason.
ADMITTED = {
    "norm.rms": Signature.make("norm.rms", {"hidden": 4096}, (), "bf16"),
    "norm.rms_add": Signature.make("norm.rms_add", {"hidden": 4096}, (), "bf16"),
    "norm.layer": Signature.make("norm.layer", {"hidden": 4096}, (), "bf16"),
    "act.swiglu": Signature.make("act.swiglu", {"width": 14336}, (), "bf16"),
    "act.geglu": Signature.make("act.geglu", {"width": 14336}, (), "bf16"),
    "posenc.rope": Signature.make("posenc.rope", {"hq": 32, "hkv": 8, "d": 128, "layout": "split_half"}, (), "bf16"),
    "attention.prefill": PREFILL,
    "attention.decode": DECODE,
}
OPTIONAL = [spec for spec in registry.REGISTRY.values()
            if spec.kernel_id.split(".")[0] in ("liger", "fa4", "fa3", "fa2", "quack")]


def codes(spec, sig, device=H100):
    return [r.code for r in spec.check(sig, device)]


def test_every_library_kernel_is_registered():
    assert {s.kernel_id for s in OPTIONAL} == {
        "liger.rms_norm", "liger.rms_norm_add", "liger.layer_norm", "liger.swiglu", "liger.geglu", "liger.rope",
        "fa4.attention", "fa3.attention", "fa2.attention", "quack.rms_norm", "quack.rms_norm_add"}
    assert "flex.attention" in registry.REGISTRY


@pytest.mark.parametrize("spec", OPTIONAL, ids=lambda s: s.kernel_id)
def test_missing_library_is_the_only_reason_on_an_h100(spec):
    (module,) = spec.requires
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        pytest.skip(f"{module} is installed here")
    for op in spec.ops:
        assert codes(spec, ADMITTED[op]) == ["NOT_INSTALLED"], op


def test_runtime_loader_imports_no_optional_library():
    probe = ("import sys, runtime_loader.registry; "
             "print([m for m in ('liger_kernel', 'fa3_fwd_interface', 'flash_attn', 'quack', 'helion') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fa3_is_hopper_only():
    fa3 = registry.get("fa3.attention")
    assert "SM_TOO_OLD" in codes(fa3, PREFILL, DeviceInfo("cuda", 80))
    assert "SM_TOO_NEW" in codes(fa3, PREFILL, DeviceInfo("cuda", 100))
    assert "DTYPE_UNSUPPORTED" in codes(fa3, Signature.make(PREFILL.op, dict(PREFILL.static), ("causal",), "fp16"))
    assert "HEAD_DIM_UNSUPPORTED" in codes(fa3, Signature.make(DECODE.op, {"hq": 8, "hkv": 2, "d": 320}, ()))


def test_fa2_is_ampere_to_hopper():
    fa2 = registry.get("fa2.attention")
    assert "SM_TOO_OLD" in codes(fa2, PREFILL, DeviceInfo("cuda", 75))
    assert "SM_TOO_NEW" in codes(fa2, PREFILL, DeviceInfo("cuda", 100))


def test_liger_rope_refuses_interleaved():
    rope = registry.get("liger.rope")
    sig = Signature.make("posenc.rope", {"hq": 4, "hkv": 2, "d": 64, "layout": "interleaved"}, ())
    assert "FEATURE_UNSUPPORTED:rope_interleaved" in codes(rope, sig)
    with pytest.raises(ValueError, match="split-half"):
        rope.impl(torch.zeros(1, 4, 2, 64), torch.zeros(1, 2, 2, 64), torch.zeros(1, 2, 64), torch.zeros(1, 2, 64), True)


# --- FlashAttention layout plumbing, through a stand-in for the CUDA library -----------------

def fake_flash_attn_func(calls):
    """FA's flash_attn_func on (batch, seq, heads, d) tensors, computed by SDPA; records what it got."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, **kwargs):
        calls.append({"q": q, "k": k, "v": v, "kwargs": kwargs})
        # FA's causal mask is bottom-right aligned: only seq_q == kv_len may reach it (checked below)
        assert not causal or q.shape[1] == k.shape[1]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal, scale=softmax_scale, enable_gqa=True)
        return out.transpose(1, 2).contiguous()  # FA allocates its output in its own layout
    return flash_attn_func


@pytest.mark.parametrize("kernel_id,module", [("fa3.attention", "fa3_fwd_interface"), ("fa2.attention", "flash_attn")])
@pytest.mark.parametrize("op,dims", [("attention.prefill", {"batch": 2, "seq": 33}),
                                     ("attention.decode", {"batch": 3, "kv_len": 70})])
def test_flash_attention_adapters_pass_views_and_match_the_reference(monkeypatch, kernel_id, module, op, dims):
    calls = []
    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(flash_attn_func=fake_flash_attn_func(calls)))
    sig = Signature.make(op, {"hq": 4, "hkv": 2, "d": 64}, ("causal",) if op == "attention.prefill" else (), "fp32")
    contract = CONTRACTS[op]
    q, k, v, causal, scale = args = contract.make_inputs(sig, dims, CPU, torch.Generator().manual_seed(0))
    ok, _, message = compare(registry.get(kernel_id).impl(*args), contract.reference(*to_fp32(args)),
                             contract.tolerances["fp32"])
    assert ok, message
    (call,) = calls
    for ours, theirs in ((q, call["q"]), (k, call["k"]), (v, call["v"])):
        assert theirs.data_ptr() == ours.data_ptr() and theirs.stride(-1) == 1  # a view, no copy
        assert theirs.shape == (ours.shape[0], ours.shape[2], ours.shape[1], ours.shape[3])


@pytest.mark.parametrize("op,dims,splits", [("attention.prefill", {"batch": 2, "seq": 530}, 1),
                                             ("attention.decode", {"batch": 3, "kv_len": 700}, 0)])
def test_fa3_splits_the_kv_for_decode_and_never_for_a_causal_prefill(monkeypatch, op, dims, splits):
    """FA3's own split heuristic made cliffs on causal prefills (benchmark log §10.10)."""
    calls = []
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", types.SimpleNamespace(flash_attn_func=fake_flash_attn_func(calls)))
    sig = Signature.make(op, {"hq": 8, "hkv": 1, "d": 64}, ("causal",) if op == "attention.prefill" else (), "fp32")
    args = CONTRACTS[op].make_inputs(sig, dims, CPU, torch.Generator().manual_seed(0))
    registry.get("fa3.attention").impl(*args)
    assert calls[0]["kwargs"]["num_splits"] == splits


def test_fa_layout_is_a_view_both_ways():
    q = torch.randn(2, 8, 5, 64)
    fa = flash_attn.fa_layout(q)
    assert fa.shape == (2, 5, 8, 64) and fa.data_ptr() == q.data_ptr() and fa.stride(-1) == 1
    assert torch.equal(flash_attn.fa_layout(fa), q)


@pytest.mark.parametrize("kernel_id", ["fa3.attention", "fa2.attention"])
def test_causal_with_unequal_lengths_is_refused(kernel_id):
    q, kv = torch.zeros(1, 4, 3, 64), torch.zeros(1, 4, 7, 64)
    with pytest.raises(ValueError, match="bottom-right"):
        registry.get(kernel_id).impl(q, kv, kv, True, None)
    flash_attn.check_causal_alignment(q, kv, causal=False)  # non-causal: any lengths
    flash_attn.check_causal_alignment(kv, kv, causal=True)  # prefill: equal lengths


def fake_fa4(calls):
    """flash_attn.cute's flash_attn_func as FA4 4.0.0b40 has it: (out, row log-sum-exp), window bounds
    None where unbounded, v's head dim free; computed by SDPA (no window: the tests below use none)."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
                        num_splits=1, **kwargs):
        calls.append({"q": q, "k": k, "v": v, "window_size": window_size, "num_splits": num_splits})
        assert not causal or q.shape[1] == k.shape[1]
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=softmax_scale, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), torch.zeros(q.shape[0], q.shape[2], q.shape[1])
    return flash_attn_func


@pytest.mark.parametrize("op,dims,splits", [("attention.prefill", {"batch": 2, "seq": 33}, 1),
                                             ("attention.decode", {"batch": 3, "kv_len": 70}, 0)])
@pytest.mark.parametrize("dv", [0, 32], ids=["dv=d", "dv=32"])
def test_fa4_passes_views_takes_a_v_head_dim_and_splits_decode_only(monkeypatch, op, dims, splits, dv):
    """FA4's adapter through a stand-in: q, k, v as views in FA's layout, v of another head dim
    (MLA: its v_head_dim feature), the KV split left to FA4 for decode only (num_splits 0), no window."""
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.SimpleNamespace(flash_attn_func=fake_fa4(calls)))
    static = {"hq": 4, "hkv": 2, "d": 64, **({"dv": dv} if dv else {})}
    sig = Signature.make(op, static, ("causal",) if op == "attention.prefill" else (), "fp32")
    spec = registry.get("fa4.attention")
    assert set(codes(spec, Signature.make(op, static, sig.flags, "bf16"))) <= {"NOT_INSTALLED"}, "dv is declared"
    contract = CONTRACTS[op]
    args = contract.make_inputs(sig, dims, CPU, torch.Generator().manual_seed(0))
    out = spec.impl(*args)
    ok, _, message = compare(out, contract.reference(*to_fp32(args)), contract.tolerances["fp32"])
    assert ok, message
    (call,) = calls
    assert call["window_size"] == (None, None) and call["num_splits"] == splits
    assert call["v"].shape[-1] == (dv or 64) and out.shape[-1] == (dv or 64)
    assert all(t.data_ptr() == a.data_ptr() for t, a in zip((call["q"], call["k"], call["v"]), args[:3]))


def test_fa4_window_bounds_are_none_where_unbounded(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", types.SimpleNamespace(flash_attn_func=fake_fa4(calls)))
    q = torch.randn(1, 2, 5, 16)
    registry.get("fa4.attention").impl(q, q, q, True, None, 3)
    registry.get("fa4.attention").impl(q[:, :, :1], q, q, False, None, 3)
    assert [c["window_size"] for c in calls] == [(2, 0), (2, None)]


def fake_quack(calls):
    """quack.rmsnorm as quack-kernels 0.6.5 has it: x_hat * (weight + weight_offset) in fp32, one
    rounding; with a residual and prenorm, (normed, x + residual) as new tensors."""
    def rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                prenorm=False, weight_offset=0.0):
        calls.append({"residual": residual is not None, "prenorm": prenorm, "weight_offset": weight_offset})
        total = x.float() + residual.float() if residual is not None else x.float()
        normed = (total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + eps) * (weight.float() + weight_offset))
        out = normed.to(x.dtype)
        return (out, total.to(x.dtype)) if residual is not None and prenorm else out
    return rmsnorm


@pytest.mark.parametrize("op", ["norm.rms", "norm.rms_add"])
@pytest.mark.parametrize("flags", [(), ("unit_offset",)], ids=["plain", "unit_offset"])
def test_quack_rms_norms_match_the_reference_and_keep_their_inputs(monkeypatch, op, flags):
    calls = []
    monkeypatch.setitem(sys.modules, "quack", types.SimpleNamespace(rmsnorm=fake_quack(calls)))
    flags = flags + (("keep_inputs",) if op == "norm.rms_add" else ())
    sig = Signature.make(op, {"hidden": 96}, flags, "fp32")
    contract = CONTRACTS[op]
    args = contract.make_inputs(sig, {"tokens": 7}, CPU, torch.Generator().manual_seed(0))
    before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
    spec = registry.get({"norm.rms": "quack.rms_norm", "norm.rms_add": "quack.rms_norm_add"}[op])
    assert set(flags) <= spec.features
    ok, _, message = compare(spec.impl(*args), contract.reference(*to_fp32(args)), contract.tolerances["fp32"])
    assert ok, message
    assert all(torch.equal(a, b) for a, b in zip([a for a in args if isinstance(a, torch.Tensor)], before))
    (call,) = calls
    assert call["weight_offset"] == (1.0 if "unit_offset" in flags else 0.0)
    assert call["residual"] == call["prenorm"] == (op == "norm.rms_add")
    assert quack.CUTE_DSL in spec.notes


# --- Liger helpers (pure torch) and kernels (Triton interpreter) -------------------------------

def test_swiglu_finds_the_gate_up_buffer_without_copying():
    sig = Signature.make("act.swiglu", {"width": 96}, (), "bf16")
    gate, up = CONTRACTS["act.swiglu"].make_inputs(sig, {"tokens": 7}, CPU, torch.Generator().manual_seed(0))
    buffer = liger._gate_up_buffer(gate, up)
    assert buffer.shape == (7, 192) and buffer.data_ptr() == gate.data_ptr()
    assert torch.equal(buffer[:, :96], gate) and torch.equal(buffer[:, 96:], up)
    assert liger._gate_up_buffer(gate.clone(), up.clone()) is None  # two projections: no shared buffer
    assert liger._gate_up_buffer(up, gate) is None  # halves in the wrong order


def test_liger_rows_keep_row_strided_views():
    wide = torch.randn(5, 300)
    rows = wide[:, :256]
    assert liger._rows(rows) is rows  # Liger's row kernels take the row stride
    assert liger._rows(wide.T).is_contiguous()  # columns not at unit stride: copied
    x3 = torch.randn(2, 3, 256)
    assert liger._rows(x3) is x3  # contiguous: .contiguous() is a no-op


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger_kernel is not installed")
def test_liger_kernels_match_the_reference_in_the_triton_interpreter():
    out = subprocess.run([sys.executable, "-m", "tests.liger_interpreter_check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0, out.stderr[-3000:]
    assert {r["kernel"] for r in results} == {s.kernel_id for s in OPTIONAL if s.library == "liger-kernel"}
    failures = [r for r in results if not (r["ok"] and r["inputs_untouched"])]
    assert not failures, "\n".join(json.dumps(r) for r in failures)


# --- FlexAttention: the per-shape compile cache ------------------------------------------------

def test_shape_key_separates_what_a_static_graph_is_specialised_on():
    q, kv = torch.randn(1, 4, 8, 32), torch.randn(1, 2, 8, 32)
    key = flex.shape_key(q, kv, kv, True, None)
    assert key == flex.shape_key(q.clone(), kv.clone(), kv.clone(), True, None)
    others = [flex.shape_key(q, kv, kv, False, None), flex.shape_key(q, kv, kv, True, 0.5),
              flex.shape_key(q.half(), kv.half(), kv.half(), True, None),
              flex.shape_key(q.transpose(1, 2).contiguous().transpose(1, 2), kv, kv, True, None),
              flex.shape_key(torch.randn(1, 4, 9, 32), torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32), True, None)]
    assert len({key, *others}) == 6


def test_one_compiled_function_and_code_object_per_key_from_any_thread():
    cache = flex.CompiledPerShape(flex._attend)
    got = {}

    def fetch(i):
        got[i] = (cache(("a",)), cache(("b", i % 2)))

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(a) for a, _ in got.values()}) == 1 and len({id(b) for _, b in got.values()}) == 2
    assert len(cache.compiled) == 3
    # Dynamo keys its cache by code object identity (equal code objects compare ==, so ids here)
    code_ids = {id(fn._torchdynamo_orig_callable.__code__) for fn in cache.compiled.values()}
    assert len(code_ids) == 3 and id(flex._attend.__code__) not in code_ids


def test_block_masks_are_cached_and_causal_is_top_left():
    from torch.nn.attention.flex_attention import create_mask

    causal = flex.mask_mod(True, 0, 0)
    mask = flex.block_mask(causal, 300, 300, CPU)
    assert flex.block_mask(flex.mask_mod(True, 0, 0), 300, 300, CPU) is mask, "one mod object per option value"
    assert mask.shape[-2:] == (300, 300) and mask.to_dense().shape[-2:] == (3, 3)  # 128-wide blocks
    assert torch.equal(create_mask(causal, 1, 1, 3, 5, CPU)[0, 0], torch.ones(3, 5, dtype=torch.bool).tril())
    assert flex.mods(False, 0, 0.0, 4, 4) == (None, None)


@pytest.mark.parametrize("causal,window,seq_q,kv_len", [(True, 3, 7, 7), (False, 4, 1, 9), (False, 0, 1, 9),
                                                         (True, 0, 5, 5), (False, 2, 6, 6)])
def test_flex_masks_match_the_reference_visibility(causal, window, seq_q, kv_len):
    """The mask mod and the eager reference agree on which keys each query sees (window, decode offset)."""
    from torch.nn.attention.flex_attention import create_mask

    from runtime_loader.ops.attention import visible_keys
    expected = visible_keys(seq_q, kv_len, causal, window, CPU)
    _, visible = flex.mods(causal, window, 0.0, seq_q, kv_len)
    got = create_mask(visible, 1, 1, seq_q, kv_len, CPU)[0, 0] if visible else None
    if expected is None:
        assert got is None
    else:
        assert torch.equal(got, expected.expand(seq_q, kv_len))


def test_a_window_that_hides_no_key_is_dropped_and_only_then():
    """effective_window is 0 exactly when the window changes no query's keys, by brute force
    over small shapes (causal prefill, decode, chunks), so kernels may take their unmasked path."""
    from runtime_loader.kernels import sdpa
    from runtime_loader.ops.attention import effective_window

    def keeps(seq_q, kv_len, causal, window):  # the definition, query by query
        start = 0 if causal else kv_len - seq_q
        return [[(not causal or j <= i) and (not window or j > start + i - window) for j in range(kv_len)]
                for i in range(seq_q)]

    for seq_q, kv_len in [(1, 1), (1, 9), (5, 5), (8, 8), (9, 9), (3, 12)]:
        for causal in (True, False) if seq_q == kv_len else (False,):
            for window in range(1, 14):
                hides = keeps(seq_q, kv_len, causal, window) != keeps(seq_q, kv_len, causal, 0)
                assert (effective_window(seq_q, kv_len, causal, window) == window) == hides, (seq_q, kv_len, window)
    q, k = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    assert torch.equal(sdpa.sdpa(q, k, k, True, None, window=9), sdpa.sdpa(q, k, k, True, None))


def test_functions_sharing_a_code_object_share_its_recompile_limit():
    """The trap the cache avoids: a fresh function object per shape is not enough."""
    private = flex.with_own_code(flex._attend)
    twin = types.FunctionType(private.__code__, private.__globals__, private.__name__)
    first, second = (torch.compile(fn, backend="eager", dynamic=False, fullgraph=True) for fn in (private, twin))
    with torch._dynamo.config.patch(recompile_limit=1):
        first(*[torch.randn(1, 2, 5, 16)] * 3, None, None, None, False)
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            second(*[torch.randn(1, 2, 7, 16)] * 3, None, None, None, False)


def test_flex_compiles_one_fused_graph_per_shape_and_never_hits_the_limit():
    """Compiled flex runs on CPU (Inductor's C++ flex template). With the recompile limit at 1,
    a cache that shared a code object would fail on the second shape; each shape instead gets
    one graph, and calling a shape again compiles nothing."""
    from torch._dynamo.utils import counters

    flex_spec = registry.get("flex.attention")
    cases = [(Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 32}, ("causal",), "fp32"),
              {"batch": 2, "seq": 33}),
             (Signature.make("attention.decode", {"hq": 4, "hkv": 1, "d": 64}, (), "fp32"), {"batch": 3, "kv_len": 70})]
    graphs = []
    with torch._dynamo.config.patch(recompile_limit=1):
        for _ in range(2):
            for sig, dims in cases:
                contract = CONTRACTS[sig.op]
                args = contract.make_inputs(sig, dims, CPU, torch.Generator().manual_seed(0))
                ok, _, message = compare(flex_spec.impl(*args), contract.reference(*to_fp32(args)),
                                         contract.tolerances[sig.dtype])
                assert ok, f"{sig}: {message}"
                graphs.append(counters["stats"]["unique_graphs"])
    new_graphs = [b - a for a, b in zip(graphs, graphs[1:])]
    assert new_graphs == [1, 0, 0], "one graph per new shape, none for a shape seen before"


def test_flash_attention_4_alone_leaves_flash_attention_2_not_installed(tmp_path, monkeypatch, fresh_import_verdicts):
    """flash-attn-4 installs flash_attn/cute in a namespace package, with no FA2 module beside it:
    fa2 is NOT_INSTALLED there, before any import and with it, not a kernel that raises when called."""
    (tmp_path / "flash_attn" / "cute").mkdir(parents=True)
    (tmp_path / "flash_attn" / "cute" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fa2, fa4 = registry.get("fa2.attention"), registry.get("fa4.attention")
        for load in (False, True):
            assert fa2.installed(load).code == "NOT_INSTALLED", load
            assert fa4.installed(load) is None, load
    finally:
        for module in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
            del sys.modules[module]  # the fake's, imported by installed(load=True)
