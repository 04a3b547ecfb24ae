"""posenc.rope: rotary position embedding of q and k, split-half or interleaved pairs."""
from __future__ import annotations

import torch

from runtime_loader.ops import DTYPES

from .base import OpContract, itemsize, randn

THETA = 500000.0
MAX_POSITION = 8192


def cos_sin(positions: torch.Tensor, d: int, interleaved: bool, theta: float = THETA):
    """(seq, d) cos and sin as Hugging Face lays them out for each pairing."""
    inv_freq = theta ** (-torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (seq, d/2)
    emb = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def make_inputs(sig, dims, device, gen):
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    interleaved = sig.dim("layout") == "interleaved"
    seq = dims["tokens"]
    q = randn((1, hq, seq, d), sig, device, gen)
    k = randn((1, hkv, seq, d), sig, device, gen)
    positions = torch.randint(0, MAX_POSITION, (seq,), generator=gen, device=device)
    cos, sin = cos_sin(positions, d, interleaved)
    dtype = DTYPES[sig.dtype]
    return q, k, cos[None].to(dtype), sin[None].to(dtype), interleaved


def _rotate_pairs(x, cos, sin, interleaved):
    """Rotate each pair (a, b) by its angle: (a cos - b sin, b cos + a sin)."""
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        c, s = cos[..., 0::2], sin[..., 0::2]
    else:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        c, s = cos[..., :half], sin[..., :half]
    ra, rb = a * c - b * s, b * c + a * s
    out = torch.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :half], out[..., half:] = ra, rb
    return out


def reference(q, k, cos, sin, interleaved):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
    return _rotate_pairs(q, cos, sin, interleaved), _rotate_pairs(k, cos, sin, interleaved)


def flops(sig, dims):
    return 3.0 * dims["tokens"] * (sig.dim("hq") + sig.dim("hkv")) * sig.dim("d")


def bytes_moved(sig, dims):
    heads = sig.dim("hq") + sig.dim("hkv")
    return float(itemsize(sig) * dims["tokens"] * sig.dim("d") * (2 * heads + 2))


ROPE = OpContract("posenc.rope", make_inputs, reference, flops, bytes_moved)
