"""linear: y = x W^T (+ b), W of shape (n, k)."""
from __future__ import annotations

import torch

from .base import OpContract, itemsize


def reference(x, weight, bias):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


def flops(sig, dims):
    return 2.0 * dims["tokens"] * sig.dim("k") * sig.dim("n")


def bytes_moved(sig, dims):
    t, k, n = dims["tokens"], sig.dim("k"), sig.dim("n")
    return float(itemsize(sig) * (t * k + k * n + t * n + (n if "bias" in sig.flags else 0)))


LINEAR = OpContract("linear", reference, flops, bytes_moved,
                    (({"k": 64, "n": 48}, ("bias",), {"tokens": 5}), ({"k": 256, "n": 384}, (), {"tokens": 33}),
                     ({"k": 1024, "n": 256}, (), {"tokens": 1})))
