"""attention.prefill (seq_q == kv_len, causal) and attention.decode (one query, all keys)."""
from __future__ import annotations

import torch

from .base import OpContract, itemsize, randn

MAX_SCORE_ELEMENTS = 1 << 26  # reference works on score blocks of at most 256 MiB in fp32


def _shapes(sig, dims):
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    batch = dims["batch"]
    seq_q, kv_len = (dims["seq"], dims["seq"]) if "seq" in dims else (1, dims["kv_len"])
    return batch, hq, hkv, d, seq_q, kv_len


def make_inputs(sig, dims, device, gen):
    batch, hq, hkv, d, seq_q, kv_len = _shapes(sig, dims)
    q = randn((batch, hq, seq_q, d), sig, device, gen)
    k = randn((batch, hkv, kv_len, d), sig, device, gen)
    v = randn((batch, hkv, kv_len, d), sig, device, gen)
    return q, k, v, "causal" in sig.flags, None


def reference(q, k, v, causal, scale):
    """softmax(q k^T * scale + causal mask) v in fp32, one kv head (and its q group) at a time,
    in blocks of query rows so the score matrix never needs more than 256 MiB."""
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    groups = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    rows = max(1, MAX_SCORE_ELEMENTS // (groups * kv_len))
    out = torch.empty_like(q)
    for b in range(batch):
        for h in range(hkv):
            qh = q[b, h * groups:(h + 1) * groups]  # (groups, seq_q, d)
            for r0 in range(0, seq_q, rows):
                r1 = min(seq_q, r0 + rows)
                scores = torch.matmul(qh[:, r0:r1], k[b, h].T) * scale
                if causal:  # top-left aligned, as SDPA: query row i sees keys 0..i
                    row = torch.arange(r0, r1, device=q.device)[:, None]
                    col = torch.arange(kv_len, device=q.device)[None, :]
                    scores = scores.masked_fill(col > row, float("-inf"))
                out[b, h * groups:(h + 1) * groups, r0:r1] = torch.matmul(scores.softmax(-1), v[b, h])
    return out


def flops(sig, dims):
    batch, hq, hkv, d, seq_q, kv_len = _shapes(sig, dims)
    full = 4.0 * batch * hq * seq_q * kv_len * d
    return full / 2 if "causal" in sig.flags else full


def bytes_moved(sig, dims):
    batch, hq, hkv, d, seq_q, kv_len = _shapes(sig, dims)
    return float(itemsize(sig) * batch * d * (2 * hq * seq_q + 2 * hkv * kv_len))


PREFILL = OpContract("attention.prefill", make_inputs, reference, flops, bytes_moved)
DECODE = OpContract("attention.decode", make_inputs, reference, flops, bytes_moved)
