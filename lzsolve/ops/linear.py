"""linear: y = x W^T (+ b), W of shape (n, k)."""
from __future__ import annotations

import torch

from .base import OpContract, itemsize, randn


def make_inputs(sig, dims, device, gen):
    k, n = sig.dim("k"), sig.dim("n")
    x = randn((dims["tokens"], k), sig, device, gen)
    weight = randn((n, k), sig, device, gen, scale=k ** -0.5)  # keeps outputs O(1)
    bias = randn((n,), sig, device, gen) if "bias" in sig.flags else None
    return x, weight, bias


def reference(x, weight, bias):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


def flops(sig, dims):
    return 2.0 * dims["tokens"] * sig.dim("k") * sig.dim("n")


def bytes_moved(sig, dims):
    t, k, n = dims["tokens"], sig.dim("k"), sig.dim("n")
    return float(itemsize(sig) * (t * k + k * n + t * n + (n if "bias" in sig.flags else 0)))


LINEAR = OpContract("linear", make_inputs, reference, flops, bytes_moved)
