"""Rotary position embedding of q and k (both pairings: split halves, interleaved pairs). Its
record, how a call is read, example inputs and eager kernel. Contract: lzsolve.ops.rope.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES, DTYPES
from ..inputs import randn
from ..specs import BOTH, HEAD_DIM_ANY, KernelSpec
from .base import OpSchema, Signature, promoted


def rope_front(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False):
    """Rotary embedding of q (batch, hq, seq, d) and k (batch, hkv, seq, d) with cos/sin
    of shape (batch or 1, seq, d) as Hugging Face builds them; returns (q, k)."""
    return (q.shape, k.shape, q.dtype, k.dtype, cos.dtype, sin.dtype, q.is_cuda, interleaved), (
        q, k, cos, sin, interleaved)


def rope_call(q, k, cos=None, sin=None, interleaved=False):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, hq, seq, d = q.shape
    static = {"hq": hq, "hkv": k.shape[1], "d": d, "layout": "interleaved" if interleaved else "split_half"}
    return Signature.make("posenc.rope", static, (), DTYPE_NAMES[q.dtype]), {"tokens": batch * seq}


def rope_fake(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """q and k rotated, each in the dtype transformers' q * cos + rotate_half(q) * sin gives it
    (bf16 q with fp32 cos/sin: fp32)."""
    return torch.empty_like(q, dtype=promoted(q, cos, sin)), torch.empty_like(k, dtype=promoted(k, cos, sin))


# --- example inputs ---------------------------------------------------------------------------------
ROPE_THETA = 500000.0
ROPE_MAX_POSITION = 8192


def cos_sin(positions: torch.Tensor, d: int, interleaved: bool, theta: float = ROPE_THETA):
    """(seq, d) cos and sin as Hugging Face lays them out for each pairing."""
    inv_freq = theta ** (-torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (seq, d/2)
    emb = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rope_inputs(sig, dims, device, gen):
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    interleaved = sig.dim("layout") == "interleaved"
    seq = dims["tokens"]
    q = randn((1, hq, seq, d), sig, device, gen)
    k = randn((1, hkv, seq, d), sig, device, gen)
    positions = torch.randint(0, ROPE_MAX_POSITION, (seq,), generator=gen, device=device)
    cos, sin = cos_sin(positions, d, interleaved)
    dtype = DTYPES[sig.dtype]
    return q, k, cos[None].to(dtype), sin[None].to(dtype), interleaved


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def rotate(x, interleaved: bool):
    """The 90-degree rotation RoPE mixes in: pairs (x1, x2) -> (-x2, x1)."""
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, cos, sin, interleaved: bool):
    """q: (batch, hq, seq, d), k: (batch, hkv, seq, d), cos/sin: (batch or 1, seq, d). cos/sin in
    another dtype than q or k (OpSchema.same_dtype) promote as in transformers' apply_rotary_pos_emb:
    bf16 q with fp32 cos gives fp32."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + rotate(q, interleaved) * sin, k * cos + rotate(k, interleaved) * sin


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    OpSchema("posenc.rope", ("hq", "hkv", "d", "layout"), (), ("tokens",), "eager.rope", method="rope",
             front=rope_front, call=rope_call, inputs=rope_inputs, fake=rope_fake, same_dtype=("k", "cos", "sin"),
             fusible=True),
)


SPECS = [
    KernelSpec("eager.rope", frozenset({"posenc.rope"}), "torch", rope,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY, head_dim_multiple=2,
               features=frozenset({"gqa", "rope_split_half", "rope_interleaved"}),
               graph_safe=True, deterministic=True),
]
