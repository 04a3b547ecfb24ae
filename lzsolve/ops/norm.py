"""norm.rms: y = x / sqrt(mean(x^2) + eps) * weight over the last dim."""
from __future__ import annotations

import torch

from .base import OpContract, itemsize, randn

EPS = 1e-5


def make_inputs(sig, dims, device, gen):
    hidden = sig.dim("hidden")
    x = randn((dims["tokens"], hidden), sig, device, gen)
    weight = randn((hidden,), sig, device, gen, scale=0.1) + 1  # trained norms sit near 1
    return x, weight, EPS


def reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def flops(sig, dims):
    return 4.0 * dims["tokens"] * sig.dim("hidden")


def bytes_moved(sig, dims):
    return float(itemsize(sig) * sig.dim("hidden") * (2 * dims["tokens"] + 1))


RMS = OpContract("norm.rms", make_inputs, reference, flops, bytes_moved)
