"""posenc.rope: rotary position embedding of q and k, split-half or interleaved pairs."""
from __future__ import annotations

import torch

from lzsolve.ops.base import OpContract, itemsize
from runtime_loader.ops.rope import cos_sin

__all__ = ["ROPE", "cos_sin", "reference"]


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


ROPE = OpContract("posenc.rope", reference, flops, bytes_moved,
                  (({"hq": 4, "hkv": 2, "d": 64, "layout": "split_half"}, (), {"tokens": 11}),
                   ({"hq": 4, "hkv": 2, "d": 64, "layout": "interleaved"}, (), {"tokens": 11}),
                   ({"hq": 8, "hkv": 8, "d": 128, "layout": "split_half"}, (), {"tokens": 5})))

CONTRACTS = (ROPE,)
