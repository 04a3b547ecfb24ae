"""FlashInfer adapters without FlashInfer: their declared capabilities and Reasons, the zero-copy
layout helpers, and their wiring, against a fake `flashinfer` module written from the 0.5.3
signatures (GPU parity is tests/test_kernels.py's gpu test)."""
import importlib.util
import shutil
import subprocess
import sys
import threading
import types
from collections import OrderedDict

import pytest
import torch

from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.kernels import flashinfer as fi
from runtime_loader.ops import Signature
from runtime_loader.ops import act as act_ops
from runtime_loader.ops import attention as attention_ops
from runtime_loader.ops import norm as norm_ops
from runtime_loader.specs import DeviceInfo

H100 = DeviceInfo("cuda", 90)
SIGNATURES = {  # one signature per op, inside every flashinfer spec's declared capabilities
    "attention.prefill": Signature.make("attention.prefill", {"hq": 8, "hkv": 2, "d": 128}, ("causal",), "bf16"),
    "attention.decode": Signature.make("attention.decode", {"hq": 8, "hkv": 2, "d": 128}, (), "bf16"),
    "norm.rms": Signature.make("norm.rms", {"hidden": 4096}, (), "bf16"),
    "norm.rms_add": Signature.make("norm.rms_add", {"hidden": 4096}, (), "bf16"),
    "norm.layer": Signature.make("norm.layer", {"hidden": 4096}, (), "bf16"),
    "act.swiglu": Signature.make("act.swiglu", {"width": 11008}, (), "bf16"),
    "act.geglu": Signature.make("act.geglu", {"width": 11008}, (), "bf16"),
    "attention.decode_fp8kv": Signature.make("attention.decode_fp8kv", {"hq": 8, "hkv": 2, "d": 128}, (), "bf16"),
}
KERNEL_IDS = {"flashinfer.prefill", "flashinfer.decode", "flashinfer.decode_tc", "flashinfer.rms_norm",
              "flashinfer.rms_norm_add", "flashinfer.layer_norm", "flashinfer.swiglu", "flashinfer.geglu",
              "flashinfer.decode_fp8kv", "flashinfer.decode_tc_fp8kv"}


def codes(reasons):
    return [r.code for r in reasons]


def only_op(spec):
    (op,) = spec.ops
    return op


# --- capabilities and Reasons --------------------------------------------------------

def test_specs_are_registered_with_their_declarations():
    assert {s.kernel_id for s in fi.SPECS} == KERNEL_IDS
    for spec in fi.SPECS:
        assert registry.get(spec.kernel_id) is spec
        assert (spec.library, spec.requires, spec.platforms, spec.min_sm) == (
            "flashinfer-python", ("flashinfer",), frozenset({"cuda"}), 80)
        assert spec.jit and spec.jit_caches == ("flashinfer",) and spec.graph_safe


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here")
@pytest.mark.parametrize("spec", fi.SPECS, ids=lambda s: s.kernel_id)
def test_without_flashinfer_each_spec_is_not_installed(spec):
    sig = SIGNATURES[only_op(spec)]
    assert codes(spec.check(sig, H100)) == ["NOT_INSTALLED"]  # everything else is declared
    assert "PLATFORM_MISMATCH" in codes(spec.check(sig, DeviceInfo("cpu")))
    assert "SM_TOO_OLD" in codes(spec.check(sig, DeviceInfo("cuda", 75)))


def test_runtime_loader_imports_without_flashinfer():
    assert "runtime_loader.kernels.flashinfer" in sys.modules  # imported above, with the registry
    assert "flashinfer" not in sys.modules  # and nothing loaded flashinfer itself


@pytest.mark.parametrize("d,admitted", [(64, True), (128, True), (256, True), (32, False), (96, False),
                                        (512, False)])
def test_attention_head_dims(d, admitted):
    for kernel_id in ("flashinfer.prefill", "flashinfer.decode", "flashinfer.decode_tc"):
        spec = registry.get(kernel_id)
        sig = Signature.make(only_op(spec), {"hq": 8, "hkv": 8, "d": d}, (), "fp16")
        assert ("HEAD_DIM_UNSUPPORTED" not in codes(spec.semantic_reasons(sig))) == admitted


def test_dtypes_are_half_precision_and_layer_norm_bf16_only():
    for spec in fi.SPECS:
        sig = SIGNATURES[only_op(spec)]
        assert "DTYPE_UNSUPPORTED" in codes(spec.semantic_reasons(Signature.make(sig.op, dict(sig.static),
                                                                                 sig.flags, "fp32")))
    layer = Signature.make("norm.layer", {"hidden": 4096}, (), "fp16")
    assert "DTYPE_UNSUPPORTED" in codes(registry.get("flashinfer.layer_norm").semantic_reasons(layer))


@pytest.fixture
def broken_flashinfer(tmp_path, monkeypatch, fresh_import_verdicts):
    """A `flashinfer` package that raises on import, as a wheel built for another CUDA does."""
    package = tmp_path / "flashinfer"
    package.mkdir()
    (package / "__init__.py").write_text("raise OSError('libcudart.so.13: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_flashinfer_that_fails_to_import_is_backend_import_failed(broken_flashinfer):
    for spec in fi.SPECS:
        reasons = spec.check(SIGNATURES[only_op(spec)], H100)
        assert codes(reasons) == ["BACKEND_IMPORT_FAILED"]
        assert "libcudart.so.13" in reasons[0].message
    assert "flashinfer" not in sys.modules


# --- zero-copy layout helpers -------------------------------------------------------

def test_gate_and_up_halves_of_one_buffer_are_passed_as_a_view(gen):
    sig = Signature.make("act.swiglu", {"width": 96}, (), "bf16")
    for tokens in (7, 1):
        gate, up = CONTRACTS["act.swiglu"].make_inputs(sig, {"tokens": tokens}, torch.device("cpu"), gen)
        fused = fi.fused_gate_up(gate, up)
        assert fused.data_ptr() == gate.data_ptr()
        assert fused.shape == (tokens, 192) and fused.stride() == (192, 1)
        assert torch.equal(fused, torch.cat((gate, up), dim=-1))


def test_gate_and_up_halves_with_leading_dims():
    gate_up = torch.randn(2, 3, 16)
    gate, up = gate_up.chunk(2, dim=-1)
    fused = fi.fused_gate_up(gate, up)
    assert fused.data_ptr() == gate_up.data_ptr() and fused.shape == gate_up.shape
    assert fused.stride() == gate_up.stride()


def test_gate_and_up_that_are_not_halves_of_one_buffer_get_no_view():
    gate_up = torch.randn(5, 16)
    assert fi.fused_gate_up(torch.randn(5, 8), torch.randn(5, 8)) is None  # two buffers
    assert fi.fused_gate_up(gate_up[:, 8:], gate_up[:, :8]) is None  # [up | gate]: the wrong order
    wider = torch.randn(5, 24)
    assert fi.fused_gate_up(wider[:, :8], wider[:, 8:16]) is None  # rows 24 apart, not 16
    assert fi.fused_gate_up(gate_up[:, :8], gate_up[:, 8:].to(torch.float64)) is None


def test_one_request_q_k_v_are_nhd_views():
    q = torch.randn(1, 4, 33, 64)
    view = fi.nhd_view(q)
    assert view.data_ptr() == q.data_ptr()
    assert view.shape == (33, 4, 64) and view.stride() == (64, 33 * 64, 1)
    assert torch.equal(view[5, 2], q[0, 2, 5])


def test_batch_queries_are_copied_to_token_rows_only_when_they_must_be():
    contiguous = torch.randn(2, 4, 9, 64)  # (batch, heads, seq, d) as the op contract makes it
    rows = fi.token_rows(contiguous)
    assert rows.shape == (18, 4, 64) and rows.data_ptr() != contiguous.data_ptr()
    assert torch.equal(rows[9 + 3, 1], contiguous[1, 1, 3])
    projected = torch.randn(2, 9, 4, 64).transpose(1, 2)  # Hugging Face's q: a view of (batch, seq, heads, d)
    rows = fi.token_rows(projected)
    assert rows.data_ptr() == projected.data_ptr() and rows.stride() == (4 * 64, 64, 1)


def test_page_table_walks_each_sequence_from_its_first_page():
    indptr, indices, last_page_len = fi.page_table(batch=2, seq=48, page_size=16, sequence_pages=6)
    assert torch.equal(indptr, torch.tensor([0, 3, 6], dtype=torch.int32))
    assert torch.equal(indices[:6], torch.tensor([0, 1, 2, 6, 7, 8], dtype=torch.int32))
    assert torch.equal(indices[6:], torch.zeros(fi.INDEX_PADDING, dtype=torch.int32))  # room for FA3's overread
    assert torch.equal(last_page_len, torch.tensor([16, 16], dtype=torch.int32))


def unpage(cache, indptr, indices):
    """An HND page pool and its page table -> (batch, heads, seq, d)."""
    return torch.stack([cache[indices[indptr[b]:indptr[b + 1]].long()].transpose(0, 1).flatten(1, 2)
                        for b in range(len(indptr) - 1)])


@pytest.mark.parametrize("layout", ["contiguous", "cache_slice", "token_major", "fused_qkv"])
def test_k_and_v_are_paged_as_views(layout):
    batch, heads, seq, d = 3, 2, 40, 8  # 40 tokens: pages of gcd(40, 16) = 8
    if layout == "contiguous":  # as the op contract and a KV cache hold them
        k, v = torch.randn(batch, heads, seq, d), torch.randn(batch, heads, seq, d)
    elif layout == "cache_slice":  # the filled part of a preallocated cache
        k, v = (torch.randn(batch, heads, 64, d)[:, :, :seq] for _ in range(2))
    elif layout == "token_major":  # as a Hugging Face projection hands them over
        k, v = (torch.randn(batch, seq, heads, d).transpose(1, 2) for _ in range(2))
    else:  # two slices of one fused qkv projection
        qkv = torch.randn(batch, seq, 5, heads, d)
        k, v = qkv[:, :, 3].transpose(1, 2), qkv[:, :, 4].transpose(1, 2)
    k_pages, v_pages, sequence_pages = fi.paged_kv(k, v)
    assert k_pages.shape[1:] == (heads, 8, d)
    assert k_pages.data_ptr() == k.data_ptr() and v_pages.data_ptr() == v.data_ptr()  # no copy
    indptr, indices, _ = fi.page_table(batch, seq, 8, sequence_pages)
    assert torch.equal(unpage(k_pages, indptr, indices), k) and torch.equal(unpage(v_pages, indptr, indices), v)


def test_k_and_v_with_different_strides_are_copied_to_one_layout():
    k, v = torch.randn(2, 2, 16, 8), torch.randn(2, 16, 2, 8).transpose(1, 2)
    k_pages, v_pages, sequence_pages = fi.paged_kv(k, v)
    assert k_pages.stride() == v_pages.stride() and v_pages.data_ptr() != v.data_ptr()
    assert sequence_pages == 2  # two heads of one 16-token page each


# --- wiring, against a fake flashinfer ------------------------------------------------

class FakeDecodeWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False):
        assert kv_layout == "HND"
        self.use_tensor_cores = use_tensor_cores
        self.plans = 0

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             q_data_type, kv_data_type, sm_scale, logits_soft_cap=None):
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        assert bool((last_page_len == page_size).all())
        assert logits_soft_cap is None or logits_soft_cap > 0, "None for no cap (0 would divide by zero)"
        self.plans += 1
        self.indptr, self.indices, self.sm_scale, self.kv_data_type = indptr, indices, sm_scale, kv_data_type
        self.softcap = logits_soft_cap or 0.0

    def run(self, q, paged_kv_cache, k_scale=None, v_scale=None):
        self.cache = paged_kv_cache
        assert (k_scale is None) == (self.kv_data_type != torch.float8_e4m3fn), "scales with an FP8 cache only"
        k, v = (unpage(cache, self.indptr, self.indices).to(q.dtype) * (scale or 1.0)
                for cache, scale in zip(paged_kv_cache, (k_scale, v_scale)))
        return attention_ops.attention(q.unsqueeze(2), k, v, False, self.sm_scale, 0, self.softcap).squeeze(2)


class FakePrefillWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        assert kv_layout == "HND"
        self.plans = 0

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, *, causal, sm_scale, q_data_type, kv_data_type,
             logits_soft_cap=None):
        assert logits_soft_cap is None or logits_soft_cap > 0, "None for no cap (0 would divide by zero)"
        self.plans += 1
        self.indptr, self.indices, self.causal, self.sm_scale = paged_kv_indptr, paged_kv_indices, causal, sm_scale
        self.seq, self.softcap = int(qo_indptr[1]), logits_soft_cap or 0.0

    def run(self, q, paged_kv_cache):
        self.q, self.cache = q, paged_kv_cache
        q = q.view(-1, self.seq, *q.shape[1:]).transpose(1, 2)  # token rows -> (batch, heads, seq, d)
        k, v = (unpage(cache, self.indptr, self.indices) for cache in paged_kv_cache)
        out = attention_ops.attention(q, k, v, self.causal, self.sm_scale, 0, self.softcap)
        return out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3])  # (batch * seq, heads, d)


@pytest.fixture
def fake(monkeypatch):
    """A `flashinfer` computing each op with the eager kernels, recording what it was handed."""
    calls = {}

    def single_prefill_with_kv_cache(q, k, v, *, causal, kv_layout, sm_scale, logits_soft_cap=None):
        assert kv_layout == "NHD" and (logits_soft_cap is None or logits_soft_cap > 0)
        calls["single_prefill"] = (q, k, v)
        q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # NHD -> (1, heads, seq, d)
        return attention_ops.attention(q, k, v, causal, sm_scale, 0, logits_soft_cap or 0.0)[0].transpose(0, 1).contiguous()

    def fused_add_rmsnorm(input, residual, weight, eps):
        residual += input
        input.copy_(norm_ops.rms_norm(residual, weight, eps))

    def layernorm(input, gemma, beta, eps):
        assert input.is_contiguous() and gemma.dtype == beta.dtype == torch.float32
        return norm_ops.layer_norm(input, gemma.to(input.dtype), beta.to(input.dtype), eps)

    def act_and_mul(activation):
        def run(input):
            assert input.is_contiguous()  # act_and_mul_kernel ignores strides
            calls["act_and_mul"] = input
            gate, up = input.chunk(2, dim=-1)
            return activation(gate, up)
        return run

    module = types.ModuleType("flashinfer")
    module.single_prefill_with_kv_cache = single_prefill_with_kv_cache
    module.BatchPrefillWithPagedKVCacheWrapper = FakePrefillWrapper
    module.BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper
    def gemma_fused_add_rmsnorm(input, residual, weight, eps):
        residual += input
        input.copy_(norm_ops.rms_norm(residual, weight, eps, True))

    module.rmsnorm = norm_ops.rms_norm
    module.gemma_rmsnorm = lambda input, weight, eps: norm_ops.rms_norm(input, weight, eps, True)
    module.fused_add_rmsnorm = fused_add_rmsnorm
    module.gemma_fused_add_rmsnorm = gemma_fused_add_rmsnorm
    module.layernorm = layernorm
    module.silu_and_mul = act_and_mul(act_ops.swiglu)
    module.gelu_tanh_and_mul = act_and_mul(act_ops.geglu)
    jit, jit_core = types.ModuleType("flashinfer.jit"), types.ModuleType("flashinfer.jit.core")
    jit_core.run_ninja = flashinfer_run_ninja
    module.jit, jit.core = jit, jit_core
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setitem(sys.modules, "flashinfer.jit", jit)
    monkeypatch.setitem(sys.modules, "flashinfer.jit.core", jit_core)
    monkeypatch.setattr(fi, "_jit_adapted", False)
    monkeypatch.setattr(fi, "_PLANS", OrderedDict())
    monkeypatch.setattr(fi, "PLAN_MS", {})
    monkeypatch.setattr(fi, "_WORKSPACES", {})
    monkeypatch.setattr(fi, "WORKSPACE_BYTES", 1024)
    return calls


def attention_inputs(batch, hq, hkv, seq_q, kv_len, d=64):
    return torch.randn(batch, hq, seq_q, d), torch.randn(batch, hkv, kv_len, d), torch.randn(batch, hkv, kv_len, d)


@pytest.mark.parametrize("kernel_id,batch,seq_q", [("flashinfer.prefill", 1, 9), ("flashinfer.prefill", 3, 9),
                                                   ("flashinfer.decode", 3, 1), ("flashinfer.decode_tc", 2, 1)])
def test_a_logit_soft_cap_reaches_flashinfer_and_plans_apart(fake, kernel_id, batch, seq_q):
    """Gemma 2's softcap: FlashInfer's logits_soft_cap (None for none), a plan of its own."""
    spec = registry.get(kernel_id)
    sig = Signature.make(only_op(spec), {"hq": 4, "hkv": 2, "d": 64, "softcap": 5.0},
                         ("causal",) if seq_q > 1 else (), "bf16")
    assert "FEATURE_UNSUPPORTED:softcap" not in codes(spec.semantic_reasons(sig))
    q, k, v = attention_inputs(batch, 4, 2, seq_q, 9 if seq_q > 1 else 24)
    causal = seq_q > 1
    capped = spec.impl(q, k, v, causal, None, 0, 5.0)
    torch.testing.assert_close(capped, attention_ops.attention(q, k, v, causal, None, 0, 5.0))
    plain = spec.impl(q, k, v, causal, None)
    assert not torch.allclose(capped, plain), "a cap small enough to bend the scores"
    assert len(fi._PLANS) == (0 if batch == 1 else 2), "capped and plain layouts planned apart"


@pytest.mark.parametrize("causal", [True, False])
def test_prefill_of_one_request_runs_on_views(fake, causal):
    q, k, v = attention_inputs(1, 4, 2, 33, 33)
    out = fi.prefill(q, k, v, causal, 0.2)
    torch.testing.assert_close(out, attention_ops.attention(q, k, v, causal, 0.2))
    assert [t.data_ptr() for t in fake["single_prefill"]] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    assert fi.PLAN_MS == {}  # nothing to plan


def test_batch_prefill_plans_once_per_layout_on_pages_of_k_and_v(fake):
    q, k, v = attention_inputs(2, 4, 2, 24, 24)  # pages of 8 tokens, 3 per head, 6 per sequence
    out = fi.prefill(q, k, v, True, None)
    torch.testing.assert_close(out, attention_ops.attention(q, k, v, True, None))
    (key, wrapper), = fi._PLANS.items()
    assert [pages.data_ptr() for pages in wrapper.cache] == [k.data_ptr(), v.data_ptr()]
    assert key == fi.PlanKey("flashinfer.prefill", 2, 24, 4, 2, 64, "fp32", "cpu", 64 ** -0.5, True, 6)
    assert wrapper.plans == 2 and key in fi.PLAN_MS  # planned, then re-planned to time the plan alone
    assert wrapper.q.data_ptr() != q.data_ptr()  # q copied to token rows
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in attention_inputs(2, 4, 2, 24, 24))
    torch.testing.assert_close(fi.prefill(q, k, v, True, None), attention_ops.attention(q, k, v, True, None))
    assert len(fi._PLANS) == 2  # token-major k and v: other pages, so another plan
    token_major = fi._PLANS[next(reversed(fi._PLANS))]
    assert [t.data_ptr() for t in (token_major.q, *token_major.cache)] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    fi.prefill(*attention_inputs(2, 4, 2, 24, 24), True, None)
    assert wrapper.plans == 2 and len(fi._PLANS) == 2


@pytest.mark.parametrize("kernel_id", ["flashinfer.decode", "flashinfer.decode_tc"])
def test_decode_plans_once_per_layout_and_pages_k_v_as_they_are(fake, kernel_id):
    impl = registry.get(kernel_id).impl
    q, k, v = attention_inputs(3, 4, 1, 1, 70)
    torch.testing.assert_close(impl(q, k, v, False, None), attention_ops.attention(q, k, v, False, None))
    (key, wrapper), = fi._PLANS.items()
    assert key == fi.PlanKey(kernel_id, 3, 70, 4, 1, 64, "fp32", "cpu", 64 ** -0.5, False, 35)  # 2-token pages
    assert [pages.data_ptr() for pages in wrapper.cache] == [k.data_ptr(), v.data_ptr()]
    assert wrapper.use_tensor_cores == (kernel_id == "flashinfer.decode_tc")
    assert wrapper.plans == 2 and fi.PLAN_MS.keys() == {key}
    q, k, v = attention_inputs(3, 4, 1, 1, 70)
    torch.testing.assert_close(impl(q, k, v, False, None), attention_ops.attention(q, k, v, False, None))
    assert wrapper.plans == 2  # same layout, new tensors: no new plan
    impl(*attention_inputs(3, 4, 1, 1, 71), False, None)
    impl(*attention_inputs(3, 4, 1, 1, 70), False, 0.5)  # the scale is fixed at plan time too
    assert len(fi._PLANS) == len(fi.PLAN_MS) == 3


@pytest.mark.parametrize("kernel_id", ["flashinfer.decode_fp8kv", "flashinfer.decode_tc_fp8kv"])
def test_fp8_cache_decode_plans_with_the_cache_dtype_and_hands_run_its_scales(fake, kernel_id):
    sig = SIGNATURES["attention.decode_fp8kv"]
    q, k, v, k_scale, v_scale, scale = CONTRACTS[sig.op].make_inputs(
        Signature.make(sig.op, {"hq": 4, "hkv": 2, "d": 64}, (), "fp32"), {"batch": 2, "kv_len": 70},
        torch.device("cpu"), torch.Generator().manual_seed(0))
    out = registry.get(kernel_id).impl(q, k, v, k_scale, v_scale, scale)
    torch.testing.assert_close(out, attention_ops.attention_fp8kv(q, k, v, k_scale, v_scale, scale))
    (key, wrapper), = fi._PLANS.items()
    assert wrapper.kv_data_type == torch.float8_e4m3fn and [p.data_ptr() for p in wrapper.cache] == [
        k.data_ptr(), v.data_ptr()], "planned for the e4m3 cache, paged as views of it"
    assert registry.get(kernel_id).setup_ms(q, k, v, k_scale, v_scale, scale) == fi.PLAN_MS[key]


def test_least_recently_used_plans_are_dropped_with_their_plan_cost(fake, monkeypatch):
    monkeypatch.setattr(fi, "MAX_PLANS", 2)
    decode = registry.get("flashinfer.decode").impl
    for kv_len in (10, 11, 10, 12):  # 10 is used again before 12 arrives: 11 goes
        decode(*attention_inputs(2, 4, 4, 1, kv_len), False, None)
    assert [key.kv_len for key in fi._PLANS] == [10, 12]
    assert fi.PLAN_MS.keys() == fi._PLANS.keys()


def test_decode_refuses_what_its_kernels_lack_before_compiling(fake):
    decode, decode_tc = registry.get("flashinfer.decode").impl, registry.get("flashinfer.decode_tc").impl
    q, k, v = attention_inputs(2, 10, 2, 1, 16)  # GQA group of 5
    with pytest.raises(ValueError, match="group sizes"):
        decode(q, k, v, False, None)
    decode_tc(q, k, v, False, None)  # the tensor-core kernel takes any group
    with pytest.raises(ValueError, match="head_dim"):
        decode_tc(*attention_inputs(2, 4, 2, 1, 16, d=192), False, None)
    with pytest.raises(ValueError, match="not causal"):
        decode_tc(q, k, v, True, None)
    assert len(fi._PLANS) == 1


def test_rms_norm_add_writes_into_x_and_residual(fake):
    x, residual, weight = torch.randn(2, 5, 64), torch.randn(2, 5, 64), torch.randn(64)
    expected = norm_ops.rms_norm_add(x, residual, weight, 1e-6)
    x_ptr, residual_ptr = x.data_ptr(), residual.data_ptr()
    normed, total = fi.rms_norm_add(x, residual, weight, 1e-6)
    torch.testing.assert_close((normed, total), expected)
    assert (normed.data_ptr(), total.data_ptr()) == (x_ptr, residual_ptr)
    assert normed.shape == total.shape == (2, 5, 64)


def test_unit_offset_norms_use_the_gemma_kernels(fake):
    x, residual, weight = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64) * 0.1
    torch.testing.assert_close(fi.rms_norm(x, weight, 1e-6, True), norm_ops.rms_norm(x, weight, 1e-6, True))
    assert not torch.allclose(fi.rms_norm(x, weight, 1e-6, True), fi.rms_norm(x, weight, 1e-6))
    expected = norm_ops.rms_norm_add(x, residual, weight, 1e-6, True)
    torch.testing.assert_close(fi.rms_norm_add(x.clone(), residual.clone(), weight, 1e-6, True), expected)


def test_norms_take_rows_with_any_leading_dims(fake):
    x, weight, bias = torch.randn(2, 3, 64, dtype=torch.bfloat16), torch.randn(64), torch.randn(64)
    torch.testing.assert_close(fi.rms_norm(x, weight.bfloat16(), 1e-6), norm_ops.rms_norm(x, weight.bfloat16(), 1e-6))
    out = fi.layer_norm(x, weight.bfloat16(), bias.bfloat16(), 1e-5)
    assert out.shape == x.shape and out.dtype == torch.bfloat16


@pytest.mark.parametrize("kernel_id,reference", [("flashinfer.swiglu", act_ops.swiglu),
                                                 ("flashinfer.geglu", act_ops.geglu)])
def test_gated_activations_get_the_gate_up_buffer_itself(fake, gen, kernel_id, reference):
    sig = Signature.make("act.swiglu", {"width": 96}, (), "bf16")
    gate, up = CONTRACTS["act.swiglu"].make_inputs(sig, {"tokens": 7}, torch.device("cpu"), gen)
    impl = registry.get(kernel_id).impl
    torch.testing.assert_close(impl(gate, up), reference(gate, up))
    assert fake["act_and_mul"].data_ptr() == gate.data_ptr()  # no copy
    gate, up = gate.clone(), up.clone()  # two buffers: concatenated
    torch.testing.assert_close(impl(gate, up), reference(gate, up))
    assert fake["act_and_mul"].data_ptr() not in (gate.data_ptr(), up.data_ptr())


def test_gated_activations_refuse_misaligned_halves(fake):
    gate_up = torch.randn(3, 24, dtype=torch.bfloat16)  # width 12: the up half starts 24 bytes in
    with pytest.raises(ValueError, match="% 16"):
        fi.swiglu(gate_up[:, :12], gate_up[:, 12:])


def fake_module(workdir, name, objects=6):
    """A module as FlashInfer 0.5.3 lays it out: <jit dir>/<name>/build.ninja, objects with gcc-style
    dependency files (`deps = gcc`, as FlashInfer's compile rules), one .so. Its "compiler" copies
    the source after a pause and notes each compile in compiles.log."""
    folder = workdir / name
    folder.mkdir(parents=True)
    lines = ["rule compile",
             f"  command = sleep 0.2 && echo $out >> {workdir}/compiles.log && echo \"$out: $in\" > $out.d && cp $in $out",
             "  depfile = $out.d", "  deps = gcc", "rule link", "  command = cat $in > $out"]
    for n in range(objects):
        source = folder / f"{n}.cu"
        source.write_text(f"// {name} {n}\n")
        lines.append(f"build {name}/{n}.o: compile {source}")
    lines += [f"build {name}/{name}.so: link " + " ".join(f"{name}/{n}.o" for n in range(objects)),
              f"default {name}/{name}.so"]
    (folder / "build.ninja").write_text("\n".join(lines) + "\n")
    return folder / "build.ninja"


def flashinfer_run_ninja(workdir, ninja_file, verbose):
    """flashinfer.jit.cpp_ext.run_ninja of 0.5.3: every module built from the one JIT folder."""
    subprocess.run(["ninja", "-C", str(workdir), "-f", str(ninja_file.resolve()), "-j", "2"], check=True,
                   capture_output=True)


def compiles_after_two_builds_at_once(workdir, run_ninja):
    """Build two modules at once from one JIT folder, then each again: the compiles the second
    builds made (none, if the first builds' records survived)."""
    files = [fake_module(workdir, name) for name in ("norm", "silu_and_mul")]
    builds = [threading.Thread(target=run_ninja, args=(workdir, f, False)) for f in files]
    for build in builds:
        build.start()
    for build in builds:
        build.join()
    log = workdir / "compiles.log"
    first = log.read_text().count("\n")
    assert first == 12 and all((f.parent / f"{f.parent.name}.so").is_file() for f in files)
    for f in files:
        run_ninja(workdir, f, False)
    return log.read_text().count("\n") - first


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_two_modules_built_at_once_are_not_built_again(tmp_path):
    """benchmark log §15.3: two processes building two FlashInfer modules at once share one ninja log,
    and ninja then built them again. With each module's logs in its folder, nothing is rebuilt."""
    assert compiles_after_two_builds_at_once(tmp_path / "shared", flashinfer_run_ninja) > 0, \
        "the race this guards against (if ninja stops losing records, the wrapper is moot)"
    own = tmp_path / "own"
    assert compiles_after_two_builds_at_once(own, fi.own_build_logs(flashinfer_run_ninja)) == 0
    assert not (own / ".ninja_log").exists() and (own / "norm" / ".ninja_log").is_file()


def test_flashinfer_builds_with_a_log_per_module(fake):
    from flashinfer.jit import core
    fi._flashinfer()
    assert core.run_ninja is not flashinfer_run_ninja and core.run_ninja.own_build_logs
    assert fi.own_build_logs(core.run_ninja) is core.run_ninja, "wrapped once"
