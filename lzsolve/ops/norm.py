"""Norms over the last dim.

norm.rms: x / sqrt(mean(x^2) + eps) * weight.
norm.rms_add: the fused residual add of a pre-norm block, (rms(x + residual) * weight,
x + residual); kernels may write both results into the storage of x and residual, as
serving engines do (vLLM's fused_add_rms_norm, FlashInfer's fused_add_rmsnorm).
norm.layer: (x - mean) / sqrt(var + eps) * weight + bias.
"""
from __future__ import annotations

import torch

from .base import OpContract, itemsize, randn

EPS = 1e-5


def _weight(sig, device, gen):
    return randn((sig.dim("hidden"),), sig, device, gen, scale=0.1) + 1  # trained norms sit near 1


def _x(sig, dims, device, gen):
    return randn((dims["tokens"], sig.dim("hidden")), sig, device, gen)


def rms_inputs(sig, dims, device, gen):
    return _x(sig, dims, device, gen), _weight(sig, device, gen), EPS


def rms_add_inputs(sig, dims, device, gen):
    return _x(sig, dims, device, gen), _x(sig, dims, device, gen), _weight(sig, device, gen), EPS


def layer_inputs(sig, dims, device, gen):
    bias = randn((sig.dim("hidden"),), sig, device, gen, scale=0.1)
    return _x(sig, dims, device, gen), _weight(sig, device, gen), bias, EPS


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_add(x, residual, weight, eps):
    total = x + residual
    return rms(total, weight, eps), total


def layer(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def flops(per_element: float):
    return lambda sig, dims: per_element * dims["tokens"] * sig.dim("hidden")


def bytes_moved(row_tensors: int, vectors: int):
    """row_tensors (tokens, hidden) tensors read or written, vectors (hidden,) read once."""
    return lambda sig, dims: float(itemsize(sig) * sig.dim("hidden") * (row_tensors * dims["tokens"] + vectors))


RMS = OpContract("norm.rms", rms_inputs, rms, flops(4.0), bytes_moved(2, 1))
RMS_ADD = OpContract("norm.rms_add", rms_add_inputs, rms_add, flops(5.0), bytes_moved(4, 1))
LAYER = OpContract("norm.layer", layer_inputs, layer, flops(7.0), bytes_moved(2, 2))
