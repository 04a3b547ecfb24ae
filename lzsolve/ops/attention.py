"""attention.prefill (seq_q == kv_len, causal) and attention.decode (one query, all keys).

Options: a sliding window (query at position p sees keys j > p - window; a prefill's query i
sits at i, a decode query, the newest token, at kv_len - 1) and Gemma 2's logit softcap (scaled
scores -> softcap * tanh(scores / softcap), before the mask and softmax), and GPT-OSS's
attention sinks (a learned logit per q head that joins each row's softmax denominator and
carries no value: out = softmax([scores, sink])[:-1] v), and a v head dim dv other than q's and
k's d (DeepSeek's MLA: d = 192, dv = 128; the output has dv, the default scale is d ** -0.5),
and BLOOM's ALiBi (the alibi flag: slope_h * key position added to head h's scaled scores, the
slopes from the q head count, runtime_loader.ops.attention.alibi_slopes).
The canonical call is (q, k, v, causal, scale), with (window, softcap) appended only when the
signature sets one of them, and sinks after them with the sinks flag, and (sinks or None, True)
after those with the alibi flag: kernels that declare none keep their five-argument form.
"""
from __future__ import annotations

import torch

from lzsolve.ops.base import OpContract, itemsize
from runtime_loader.ops.attention import alibi_slopes, value_dim
from runtime_loader.ops.attention import attention_shapes as _shapes

MAX_SCORE_ELEMENTS = 1 << 26  # reference works on score blocks of at most 256 MiB in fp32


def reference(q, k, v, causal, scale, window=0, softcap=0.0, sinks=None, alibi=False):
    """softmax(mask(softcap(q k^T * scale) + alibi)) v in fp32 (each row's sink logit, where given, one
    more column of the softmax; ALiBi's slope_h * (key - query position)), one kv head (and its q group) at a time, in blocks of query rows
    so the score matrix never needs more than 256 MiB."""
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    groups = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    rows = max(1, MAX_SCORE_ELEMENTS // (groups * kv_len))
    col = torch.arange(kv_len, device=q.device)[None, :]
    slopes = alibi_slopes(hq, q.device) if alibi else None
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # v's head dim (MLA's differs from q's)
    for b in range(batch):
        for h in range(hkv):
            qh = q[b, h * groups:(h + 1) * groups]  # (groups, seq_q, d)
            for r0 in range(0, seq_q, rows):
                r1 = min(seq_q, r0 + rows)
                scores = torch.matmul(qh[:, r0:r1], k[b, h].T) * scale
                if softcap:
                    scores = softcap * torch.tanh(scores / softcap)
                row = torch.arange(r0, r1, device=q.device)[:, None]
                if alibi:  # relative to the query's position, as the window (a constant per row to BLOOM's slope * key)
                    position = row if causal else row + (kv_len - seq_q)
                    scores = scores + slopes[h * groups:(h + 1) * groups, None, None] * (col - position)
                if causal:  # top-left aligned, as SDPA: query row i sees keys 0..i
                    scores = scores.masked_fill(col > row, float("-inf"))
                if window:  # counted back from the query's position: i, or kv_len - 1 for a decode query
                    position = row if causal else row + (kv_len - seq_q)
                    scores = scores.masked_fill(col <= position - window, float("-inf"))
                if sinks is not None:
                    sink = sinks[h * groups:(h + 1) * groups, None, None].to(scores.dtype)
                    probs = torch.cat([scores, sink.expand(-1, r1 - r0, 1)], dim=-1).softmax(-1)[..., :-1]
                else:
                    probs = scores.softmax(-1)
                out[b, h * groups:(h + 1) * groups, r0:r1] = torch.matmul(probs, v[b, h])
    return out


def query_key_pairs(sig, dims) -> float:
    """The (query, key) pairs one batch row of one q head scores, exactly as the reference masks
    them. Causal (a prefill, seq_q == kv_len): query i sees keys max(0, i - w + 1)..i, min(i + 1, w)
    of them, w the window or seq_q: w (w + 1) / 2 over the first w queries, w each after. Not
    causal: query i sits at position p = i + kv_len - seq_q (a decode query at kv_len - 1) and
    sees keys p - w + 1..kv_len - 1, so its keys are kv_len less max(0, p - w + 1), summed in
    closed form (an arithmetic series over the queries whose window starts past key 0)."""
    seq_q, kv_len = _shapes(sig, dims)[4:]
    window = sig.dim("window") or kv_len
    if "causal" in sig.flags:
        w = min(window, seq_q)
        return w * (w + 1) / 2 + (seq_q - w) * w
    c = kv_len - seq_q - window + 1  # query i hides max(0, i + c) keys
    first = max(0, 1 - c)  # the first query that hides any
    hiding = max(0, seq_q - first)
    return float(seq_q * kv_len - (hiding * (first + c) + hiding * (hiding - 1) / 2))


def flops(sig, dims):
    """2 d for a score (q . k) and 2 dv for its share of the output (p v; dv is d where the signature
    has none), per (query, key) pair the mask keeps (query_key_pairs): a causal prefill scores
    s (s + 1) / 2 pairs, not s^2 / 2."""
    batch, hq, hkv, d, seq_q, kv_len = _shapes(sig, dims)
    return 2.0 * batch * hq * query_key_pairs(sig, dims) * (d + value_dim(sig))


def bytes_moved(sig, dims):
    """q (d) and out (dv), the keys (d) and values (dv) some query sees (a decode query reads only
    its window), and the sinks' logit per q head."""
    batch, hq, hkv, d, seq_q, kv_len = _shapes(sig, dims)
    window = sig.dim("window")
    keys_read = min(kv_len, window + seq_q - 1) if window else kv_len
    sinks = hq if "sinks" in sig.flags else 0
    return float(itemsize(sig) * (batch * (d + value_dim(sig)) * (hq * seq_q + hkv * keys_read) + sinks))


# every combination at head_dim 128 (and batch 1 and 2: some libraries take another path for a
# batch), then head dims 64 and 256, then DeepSeek's MLA heads (q/k 192, v 128), with GQA too
PREFILL_CASES = (({"hq": 8, "hkv": 1, "d": 128}, ("causal",), {"batch": 1, "seq": 257}),
                 ({"hq": 4, "hkv": 2, "d": 128}, ("causal",), {"batch": 2, "seq": 33}),
                 ({"hq": 4, "hkv": 4, "d": 128}, (), {"batch": 1, "seq": 70}),
                 ({"hq": 4, "hkv": 2, "d": 128}, ("causal", "qk_norm"), {"batch": 2, "seq": 33}),
                 ({"hq": 4, "hkv": 2, "d": 128, "window": 16}, ("causal",), {"batch": 2, "seq": 70}),
                 ({"hq": 4, "hkv": 2, "d": 128, "softcap": 1.0}, ("causal",), {"batch": 2, "seq": 33}),
                 ({"hq": 4, "hkv": 4, "d": 128, "window": 16, "softcap": 2.0}, ("causal",), {"batch": 1, "seq": 40}),
                 ({"hq": 4, "hkv": 2, "d": 64}, ("causal",), {"batch": 2, "seq": 33}),
                 ({"hq": 2, "hkv": 1, "d": 256}, ("causal",), {"batch": 2, "seq": 40}),
                 # GPT-OSS: sinks, alone and with its sliding window
                 ({"hq": 8, "hkv": 2, "d": 64}, ("causal", "sinks"), {"batch": 2, "seq": 70}),
                 ({"hq": 4, "hkv": 2, "d": 64, "window": 16}, ("causal", "sinks"), {"batch": 1, "seq": 70}),
                 ({"hq": 4, "hkv": 4, "d": 192, "dv": 128}, ("causal",), {"batch": 2, "seq": 33}),
                 ({"hq": 4, "hkv": 2, "d": 96, "dv": 64}, ("causal",), {"batch": 1, "seq": 70}),
                 # BLOOM: ALiBi, MHA; a head count that is not a power of two (its extra slopes)
                 ({"hq": 8, "hkv": 8, "d": 64}, ("causal", "alibi"), {"batch": 2, "seq": 70}),
                 ({"hq": 6, "hkv": 6, "d": 128}, ("causal", "alibi"), {"batch": 1, "seq": 33}))
DECODE_CASES = (({"hq": 8, "hkv": 1, "d": 128}, (), {"batch": 2, "kv_len": 300}),
                ({"hq": 4, "hkv": 4, "d": 128}, (), {"batch": 1, "kv_len": 129}),
                ({"hq": 8, "hkv": 2, "d": 128}, ("qk_norm",), {"batch": 2, "kv_len": 70}),
                ({"hq": 8, "hkv": 2, "d": 128, "window": 32}, (), {"batch": 2, "kv_len": 70}),
                ({"hq": 8, "hkv": 2, "d": 128, "softcap": 1.0}, (), {"batch": 2, "kv_len": 70}),
                ({"hq": 4, "hkv": 1, "d": 64}, (), {"batch": 3, "kv_len": 70}),
                ({"hq": 4, "hkv": 4, "d": 256}, (), {"batch": 1, "kv_len": 129}),
                ({"hq": 8, "hkv": 2, "d": 64}, ("sinks",), {"batch": 2, "kv_len": 70}),
                ({"hq": 8, "hkv": 2, "d": 64, "window": 32}, ("sinks",), {"batch": 2, "kv_len": 70}),
                ({"hq": 8, "hkv": 8, "d": 192, "dv": 128}, (), {"batch": 2, "kv_len": 70}),
                ({"hq": 8, "hkv": 8, "d": 64}, ("alibi",), {"batch": 2, "kv_len": 70}),
                ({"hq": 12, "hkv": 12, "d": 64}, ("alibi",), {"batch": 1, "kv_len": 129}))
PREFILL = OpContract("attention.prefill", reference, flops, bytes_moved, PREFILL_CASES)
DECODE = OpContract("attention.decode", reference, flops, bytes_moved, DECODE_CASES)


# --- decode over an FP8 KV cache (issue 18): k and v stored in float8 e4m3, one scale each ----------
def fp8kv_reference(q, k, v, k_scale, v_scale, scale):
    """In fp32 from the dequantised cache (its rounding is the format's, not a kernel's)."""
    return reference(q, k.float() * k_scale, v.float() * v_scale, False, scale)


def fp8kv_flops(sig, dims):
    return 4.0 * dims["batch"] * sig.dim("hq") * dims["kv_len"] * sig.dim("d")


def fp8kv_bytes(sig, dims):
    """q and out in the activation dtype; the keys and values at one byte each."""
    batch, hq, hkv, d, kv_len = dims["batch"], sig.dim("hq"), sig.dim("hkv"), sig.dim("d"), dims["kv_len"]
    return float(batch * d * (2 * itemsize(sig) * hq + 2 * hkv * kv_len))


# GQA with an odd cache length, plain MHA, and head dim 64
DECODE_FP8KV = OpContract("attention.decode_fp8kv", fp8kv_reference, fp8kv_flops, fp8kv_bytes,
                          (({"hq": 8, "hkv": 1, "d": 128}, (), {"batch": 2, "kv_len": 300}),
                           ({"hq": 4, "hkv": 4, "d": 128}, (), {"batch": 1, "kv_len": 129}),
                           ({"hq": 4, "hkv": 2, "d": 64}, (), {"batch": 3, "kv_len": 70})))

# --- MLA's decode over its compressed latent cache, the weights absorbed (issue 60) ---------------
def mla_reference(q_nope, q_pe, kv, k_pe, scale):
    """In fp32: every head's scores against the latent and k's RoPE part, then the latent as values."""
    scale = (q_nope.shape[-1] + q_pe.shape[-1]) ** -0.5 if scale is None else scale
    scores = (q_nope @ kv.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * scale
    return scores.softmax(-1) @ kv


def mla_flops(sig, dims):
    """Scores over rank + rope dims, then the values over rank, for each head and cached token."""
    rank, rope = sig.dim("rank"), sig.dim("rope")
    return 2.0 * dims["batch"] * sig.dim("hq") * dims["kv_len"] * (2 * rank + rope)


def mla_bytes(sig, dims):
    """The cache once (latent and RoPE part), the queries and the output."""
    batch, hq, rank, rope = dims["batch"], sig.dim("hq"), sig.dim("rank"), sig.dim("rope")
    return float(itemsize(sig) * batch * ((rank + rope) * (dims["kv_len"] + hq) + hq * rank))


# DeepSeek-V3's latent (512 + 64) at a TP-8 rank's 16 heads, and small odd sizes
MLA_DECODE = OpContract("attention.mla_decode", mla_reference, mla_flops, mla_bytes,
                        (({"hq": 16, "rank": 512, "rope": 64}, (), {"batch": 2, "kv_len": 70}),
                         ({"hq": 4, "rank": 64, "rope": 16}, (), {"batch": 3, "kv_len": 129}),
                         ({"hq": 1, "rank": 32, "rope": 8}, (), {"batch": 1, "kv_len": 5})))

CONTRACTS = (PREFILL, DECODE, DECODE_FP8KV, MLA_DECODE)
