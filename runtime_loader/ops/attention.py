"""Attention: prefill (seq_q == kv_len), decode (one query over a cache), a decode step over
an FP8 KV cache and one of MLA over its compressed latent cache (absorbed). Their records, how a call is read, their example inputs, the eager reference
(the fallback where SDPA cannot: softcap, sinks) and the FP8 cache's baseline. ALiBi (BLOOM's linear
position biases, the alibi flag) adds slope_h * key position to each head's scaled scores, its slopes
from the head count (alibi_slopes); kernels must declare "alibi".

Layout (batch, heads, seq, head_dim); GQA when kv heads divide q heads. The value head dim may
differ from q's and k's (DeepSeek's multi-head latent attention: q and k 192, v 128): the
signature then names it, dv, which kernels must declare ("v_head_dim"). The fallback of prefill
and decode is SDPA's default (runtime_loader.kernels.sdpa). Contract: lzsolve.ops.attention.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES
from ..inputs import randn
from ..quant import E4M3_MAX
from ..specs import BOTH, HEAD_DIM_ANY, KernelSpec
from .base import OpSchema, Signature


def attention_front(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None, window: int = 0,
                    softcap: float = 0.0, sinks: Tensor | None = None, alibi: bool = False, qk_norm: bool = False):
    """SDPA semantics, layout (batch, heads, seq, head_dim); GQA when kv heads divide q heads.
    window: a query at position p sees keys j > p - window, where p is i for query i under a
    causal mask and kv_len - seq_q + i without one (a decode query is the newest token);
    softcap: scaled scores become softcap * tanh(scores / softcap) before the mask (Gemma 2);
    sinks: one learned logit per q head, (q heads,), that joins every row of the softmax's
    denominator and carries no value (GPT-OSS's attention sinks); alibi: each head's scaled scores
    gain slope_h * key position, slopes from the q head count as BLOOM's (alibi_slopes; under the
    softmax the same as slope_h * (key position - query position)); qk_norm: q and k come from a
    per-head norm (no change to the math, only to which kernels may serve the call). v's head dim
    may differ from q's and k's (MLA); the output has v's."""
    # v.shape, not k.shape: a valid SDPA call has k.shape == v.shape but for the last dim, which must equal q's
    return ((q.shape, v.shape, q.dtype, q.is_cuda, causal, window, softcap, sinks is None, alibi, qk_norm),
            (q, k, v, causal, scale, window, softcap, sinks, alibi) if alibi
            else (q, k, v, causal, scale, window, softcap, sinks) if sinks is not None
            else (q, k, v, causal, scale, window, softcap) if window or softcap else (q, k, v, causal, scale))


def attention_call(q, k, v, causal=True, scale=None, window=0, softcap=0.0, sinks=None, alibi=False, qk_norm=False):
    if (q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.dtype not in DTYPE_NAMES or k.shape[-1] != q.shape[-1]
            or sinks is not None and sinks.shape != q.shape[1:2]):
        return None
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    # int and float as the schema's defaults, so softcap=50 and softcap=50.0 name one signature;
    # dv only where v's head dim differs from q's (0, the default, is "the same": signatures read as before)
    dv = v.shape[-1] if v.shape[-1] != d else 0
    static = {"hq": hq, "hkv": hkv, "d": d, "window": int(window), "softcap": float(softcap), "dv": dv}
    dtype = DTYPE_NAMES[q.dtype]
    marker = ("qk_norm",) * qk_norm + ("sinks",) * (sinks is not None) + ("alibi",) * bool(alibi)
    if seq_q == kv_len:
        flags = ("causal",) if causal else ()
        return Signature.make("attention.prefill", static, flags + marker, dtype), {"batch": batch, "seq": seq_q}
    if seq_q == 1 and not causal:
        return Signature.make("attention.decode", static, marker, dtype), {"batch": batch, "kv_len": kv_len}
    return None  # e.g. chunked prefill: SDPA's top-left causal alignment is kept by the fallback


def attention_outside(q, k, v, causal, scale, window=0, softcap=0.0, sinks=None, alibi=False) -> str:
    """A call outside the signatures (chunked prefill) goes to SDPA (ALiBi as a float mask), or to the
    reference where SDPA cannot softcap or take sinks."""
    return "eager.attention" if softcap or sinks is not None else "sdpa.default"


def attention_fake(q: Tensor, k: Tensor, v: Tensor, *args) -> Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def attention_fp8kv_front(q: Tensor, k: Tensor, v: Tensor, k_scale: float = 1.0, v_scale: float = 1.0,
                          scale: float | None = None):
    """A decode step over an FP8 KV cache: q (batch, q heads, 1, d) in the activation dtype, k and
    v (batch, kv heads, kv_len, d) in float8 e4m3, each dequantised by its scale (per tensor, as
    vLLM's and FlashInfer's FP8 caches keep them); GQA when kv heads divide q heads."""
    return (q.shape, v.shape, q.dtype, q.is_cuda), (q, k, v, k_scale, v_scale, scale)


def attention_fp8kv_call(q, k, v, k_scale=1.0, v_scale=1.0, scale=None):
    if (q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES or k.dtype != torch.float8_e4m3fn
            or v.dtype != torch.float8_e4m3fn or q.shape[2] != 1):
        return None
    batch, hq, _, d = q.shape
    static = {"hq": hq, "hkv": k.shape[1], "d": d}
    return (Signature.make("attention.decode_fp8kv", static, (), DTYPE_NAMES[q.dtype]),
            {"batch": batch, "kv_len": k.shape[2]})


def mla_decode_front(q_nope: Tensor, q_pe: Tensor, kv: Tensor, k_pe: Tensor, scale: float | None = None):
    """A decode step of multi-head latent attention (DeepSeek-V2/V3) over its compressed cache, in the
    absorbed form (FlashMLA's, vLLM's): q_nope (batch, q heads, 1, rank), each head's non-RoPE query
    already multiplied by its key up-projection; q_pe (batch, q heads, 1, rope), the rotated RoPE part;
    kv (batch, 1, kv_len, rank), the normed latent cache, and k_pe (batch, 1, kv_len, rope), k's
    shared rotated part, as transformers' cache keeps them. Returns (batch, q heads, 1, rank):
    softmax((q_nope kv^T + q_pe k_pe^T) * scale) kv, the latent each head's value up-projection then
    reads. scale None: (rank + rope) ** -0.5 (a model passes its own: qk_head_dim ** -0.5)."""
    return (q_nope.shape, kv.shape, q_pe.shape, q_nope.dtype, q_nope.is_cuda), (q_nope, q_pe, kv, k_pe, scale)


def mla_decode_call(q_nope, q_pe, kv, k_pe, scale=None):
    if (any(t.dim() != 4 for t in (q_nope, q_pe, kv, k_pe)) or q_nope.dtype not in DTYPE_NAMES
            or q_nope.shape[2] != 1 or kv.shape[1] != 1 or k_pe.shape[1] != 1 or q_pe.shape[:3] != q_nope.shape[:3]
            or kv.shape[-1] != q_nope.shape[-1] or k_pe.shape[-1] != q_pe.shape[-1] or kv.shape[:3] != k_pe.shape[:3]):
        return None
    batch, hq, _, rank = q_nope.shape
    static = {"hq": hq, "rank": rank, "rope": q_pe.shape[-1]}
    return (Signature.make("attention.mla_decode", static, (), DTYPE_NAMES[q_nope.dtype]),
            {"batch": batch, "kv_len": kv.shape[2]})


# --- example inputs ---------------------------------------------------------------------------------
def value_dim(sig) -> int:
    """The head dim of v (and of the output): dv where the signature sets it, else d."""
    return dict(sig.static).get("dv") or sig.dim("d")


def attention_shapes(sig, dims):
    """(batch, hq, hkv, d, seq_q, kv_len): a prefill has seq, a decode one query and kv_len keys
    (v's head dim: value_dim)."""
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    batch = dims["batch"]
    seq_q, kv_len = (dims["seq"], dims["seq"]) if "seq" in dims else (1, dims["kv_len"])
    return batch, hq, hkv, d, seq_q, kv_len


def attention_inputs(sig, dims, device, gen):
    """(q, k, v, causal, scale), with (window, softcap) appended only when the signature sets one,
    and sinks after them with the sinks flag (logits about as large as a short row's log-sum-exp,
    so they take a real share of the softmax), and (sinks or None, True) with the alibi flag."""
    batch, hq, hkv, d, seq_q, kv_len = attention_shapes(sig, dims)
    q = randn((batch, hq, seq_q, d), sig, device, gen)
    k = randn((batch, hkv, kv_len, d), sig, device, gen)
    v = randn((batch, hkv, kv_len, value_dim(sig)), sig, device, gen)
    options = (sig.dim("window"), sig.dim("softcap"))
    sinks = randn((hq,), sig, device, gen).add_(1.0) if "sinks" in sig.flags else None
    if "alibi" in sig.flags:
        return q, k, v, "causal" in sig.flags, None, *options, sinks, True
    if sinks is not None:
        return q, k, v, "causal" in sig.flags, None, *options, sinks
    return (q, k, v, "causal" in sig.flags, None) + (options if any(options) else ())


def attention_fp8kv_inputs(sig, dims, device, gen):
    """A cache written as FP8 caches are: k and v divided by their scale into e4m3 (a fixed scale
    that maps N(0, 1) values well inside e4m3's range: no device sync to measure an amax)."""

    batch, hq, hkv, d, _, kv_len = attention_shapes(sig, dims)
    q = randn((batch, hq, 1, d), sig, device, gen)
    k_scale, v_scale = 1 / 64, 1 / 48

    def cached(scale):
        values = torch.randn((batch, hkv, kv_len, d), generator=gen, device=device) / scale
        return values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, cached(k_scale), cached(v_scale), k_scale, v_scale, None


def mla_decode_inputs(sig, dims, device, gen):
    """(q_nope, q_pe, kv, k_pe, scale) with the scale of a model whose q/k heads are a quarter of the
    latent plus the RoPE part (DeepSeek's 128 + 64 beside 512), so the scores are not flattened."""
    batch, hq, rank, rope, kv_len = dims["batch"], sig.dim("hq"), sig.dim("rank"), sig.dim("rope"), dims["kv_len"]
    return (randn((batch, hq, 1, rank), sig, device, gen), randn((batch, hq, 1, rope), sig, device, gen),
            randn((batch, 1, kv_len, rank), sig, device, gen), randn((batch, 1, kv_len, rope), sig, device, gen),
            (rank // 4 + rope) ** -0.5)


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def effective_window(seq_q: int, kv_len: int, causal: bool, window: int) -> int:
    """`window`, or 0 when it hides no key: every query sits below it (a prompt or a cache shorter
    than the window, as most requests to a Mistral or Gemma sliding layer are), so a kernel can
    take its plain causal path instead of a mask."""
    last_position = seq_q - 1 if causal else kv_len - 1
    return window if window and last_position >= window else 0


def visible_keys(seq_q: int, kv_len: int, causal: bool, window: int, device):
    """Which keys each query sees, as a (seq_q, kv_len) boolean mask; None when it sees them all.
    Query i sits at position i under a causal mask (SDPA's top-left alignment: it sees keys 0..i)
    and at kv_len - seq_q + i without one (the newest tokens: a decode query is at kv_len - 1);
    a window lets it see keys j > position - window. Every query keeps at least one key."""
    window = effective_window(seq_q, kv_len, causal, window)
    if not causal and not window:
        return None
    query = torch.arange(seq_q, device=device)[:, None]
    key = torch.arange(kv_len, device=device)[None, :]
    keep = key <= query if causal else torch.ones(seq_q, kv_len, dtype=torch.bool, device=device)
    if window:
        position = query if causal else query + (kv_len - seq_q)
        keep = keep & (key > position - window)
    return keep


def alibi_slopes(heads: int, device=None) -> Tensor:
    """ALiBi's slope per head (fp32), as BLOOM's build_alibi_tensor makes them: for the largest power
    of two c <= heads, 2 ** (-8 k / c) for k = 1..c, then for the heads past c the odd k of
    2 ** (-8 k / 2c)."""
    closest = 2 ** math.floor(math.log2(heads))
    slopes = [2.0 ** (-8.0 * k / closest) for k in range(1, closest + 1)]
    slopes += [2.0 ** (-4.0 * k / closest) for k in range(1, 2 * min(closest, heads - closest), 2)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def alibi_bias(heads: int, seq_q: int, kv_len: int, causal: bool, device) -> Tensor:
    """(heads, seq_q, kv_len) fp32: slope_h * (j - p_i), p_i query i's position (i under a causal
    mask, kv_len - seq_q + i without one), so the keys a query sees get biases <= 0. BLOOM adds
    slope_h * j; the two differ by a constant per row, which the softmax cancels."""
    query = torch.arange(seq_q, device=device, dtype=torch.float32)[:, None] + (0 if causal else kv_len - seq_q)
    key = torch.arange(kv_len, device=device, dtype=torch.float32)[None, :]
    return alibi_slopes(heads, device)[:, None, None] * (key - query)


def with_sinks(out, lse, sinks):
    """Attention over the keys alone, made attention with sinks: each row's sink logit joins the
    denominator, exp(lse) -> exp(lse) + exp(sink), so the row scales by sigmoid(lse - sink).
    out (batch, heads, seq_q, d); lse (batch, heads, seq_q), the natural log-sum-exp of the row's
    scaled scores that flash kernels return; sinks (heads,)."""
    scale = torch.sigmoid(lse.float() - sinks.float()[None, :, None])
    return (out.float() * scale[..., None]).to(out.dtype)


def attention(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None,
              alibi: bool = False):
    """window and softcap are passed only by signatures that set them, sinks by those with sinks
    (see lzsolve.ops.attention); a sink is one more column of the softmax, as GPT-OSS's eager
    attention computes it; ALiBi's biases are added to the scaled scores (after softcap, as BLOOM has none)."""
    groups = q.shape[1] // k.shape[1]
    if groups != 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if softcap:  # Gemma 2: squash the scaled scores, then mask
        scores = torch.tanh(scores / softcap) * softcap
    if alibi:
        scores = scores + alibi_bias(q.shape[1], q.shape[2], k.shape[2], causal, q.device)
    keep = visible_keys(q.shape[2], k.shape[2], causal, window, q.device)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    if sinks is None:
        return torch.matmul(scores.softmax(-1).to(q.dtype), v)
    sink_column = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
    probs = torch.cat([scores, sink_column], dim=-1).softmax(-1)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)


def attention_fp8kv(q, k, v, k_scale: float, v_scale: float, scale=None):
    """The baseline any device runs: the cache dequantised to q's dtype, then SDPA's default."""
    k, v = k.to(q.dtype) * k_scale, v.to(q.dtype) * v_scale
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def mla_decode(q_nope, q_pe, kv, k_pe, scale=None):
    """Two matmuls of every head against the one latent cache (broadcast over heads: nothing copied or
    expanded), the softmax in fp32, the latent read once more as the values."""
    scale = (q_nope.shape[-1] + q_pe.shape[-1]) ** -0.5 if scale is None else scale
    scores = (torch.matmul(q_nope, kv.transpose(-1, -2)) + torch.matmul(q_pe, k_pe.transpose(-1, -2))).float() * scale
    return torch.matmul(scores.softmax(-1).to(q_nope.dtype), kv)


# --- the records ---------------------------------------------------------------------------------------
# The tuner's buckets per named grid (lzsolve.measure.grid): tiny for tests, small the default on a CPU, full
# on a GPU, at the decode and prefill sizes a server sees. Prefill measures batch 1 and 2 both:
# adapters switch paths there (FlashInfer: single prefill vs paged batch prefill), and a tree fed
# batch 1 and 4 alone sent batch 2 to the batch-1 winner (1.9x regret on the H100, benchmarks/device.sh suite).
PREFILL_BUCKETS = {"tiny": {"batch": (1,), "seq": (16, 64)},
                   "small": {"batch": (1, 2), "seq": (32, 128, 512)},
                   "full": {"batch": (1, 2, 8), "seq": (128, 512, 2048, 8192)}}
DECODE_BUCKETS = {"tiny": {"batch": (1, 2), "kv_len": (64,)},
                  "small": {"batch": (1, 8), "kv_len": (128, 1024)},
                  "full": {"batch": (1, 8, 32, 128), "kv_len": (512, 2048, 8192)}}
# dv: v's head dim where it differs from q's and k's (MLA); 0, the default, where it does not
ATTENTION_OPTIONAL = (("window", 0), ("softcap", 0.0), ("dv", 0))
ATTENTION = dict(method="attention", front=attention_front, call=attention_call, inputs=attention_inputs,
                 fake=attention_fake, outside=attention_outside)


RECORDS = (
    # window: query i sees keys j with i - window < j (0: all); softcap: scores -> softcap * tanh(scores / softcap);
    # qk_norm: q and k come from a per-head norm (norm.qk), so a kernel must not fuse what precedes it
    # sinks: a learned logit per q head in the softmax's denominator (GPT-OSS); dv: v's head dim, where not d;
    # alibi: slope_h * key position added to the scaled scores (BLOOM)
    OpSchema("attention.prefill", ("hq", "hkv", "d"), ("causal", "qk_norm", "sinks", "alibi"), ("batch", "seq"),
             "sdpa.default", ATTENTION_OPTIONAL, "eager.attention", labels=("qk_norm",), buckets=PREFILL_BUCKETS,
             **ATTENTION),
    OpSchema("attention.decode", ("hq", "hkv", "d"), ("qk_norm", "sinks", "alibi"), ("batch", "kv_len"), "sdpa.default",
             ATTENTION_OPTIONAL, "eager.attention", labels=("qk_norm",), buckets=DECODE_BUCKETS, **ATTENTION),
    # a decode step over an FP8 (e4m3) KV cache with a scale for k and one for v
    OpSchema("attention.decode_fp8kv", ("hq", "hkv", "d"), (), ("batch", "kv_len"), "eager.attention_fp8kv",
             method="attention_fp8kv", front=attention_fp8kv_front, call=attention_fp8kv_call,
             inputs=attention_fp8kv_inputs, fake=attention_fake, buckets=DECODE_BUCKETS),
    # a decode step of MLA over its compressed latent cache, the weights absorbed (DeepSeek-V2/V3)
    OpSchema("attention.mla_decode", ("hq", "rank", "rope"), (), ("batch", "kv_len"), "eager.mla_decode",
             method="mla_decode", front=mla_decode_front, call=mla_decode_call, inputs=mla_decode_inputs,
             buckets=DECODE_BUCKETS),
)


SPECS = [
    KernelSpec("eager.attention", frozenset({"attention.prefill", "attention.decode"}), "torch", attention,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=frozenset({"causal", "gqa", "sliding_window", "softcap", "qk_norm", "sinks", "v_head_dim",
                                   "alibi"}),
               graph_safe=True,
               deterministic=True, notes="matmul + fp32 softmax + matmul; materialises the score matrix; "
                                         "the reference for what SDPA cannot do (softcap, sinks)"),
    KernelSpec("eager.attention_fp8kv", frozenset({"attention.decode_fp8kv"}), "torch", attention_fp8kv, platforms=BOTH,
               dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY, features=frozenset({"gqa"}), graph_safe=True,
               notes="dequantise the whole cache to q's dtype, then SDPA"),
    KernelSpec("eager.mla_decode", frozenset({"attention.mla_decode"}), "torch", mla_decode, platforms=BOTH,
               dtypes=ALL_DTYPES, graph_safe=True, deterministic=True,
               notes="q_nope kv^T + q_pe k_pe^T broadcast over heads, fp32 softmax, then kv as the values"),
]
