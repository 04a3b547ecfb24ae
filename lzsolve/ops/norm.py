"""Norms over the last dim.

norm.rms: x / sqrt(mean(x^2) + eps) * weight.
norm.rms_add: the fused residual add of a pre-norm block, (rms(x + residual) * weight,
x + residual); kernels may write both results into the storage of x and residual, as
serving engines do (vLLM's fused_add_rms_norm, FlashInfer's fused_add_rmsnorm).
norm.qk: rms over each head of x (tokens, heads, d) with one weight (d,) for every head
(Qwen3's and Gemma 3's q_norm / k_norm).
norm.layer: (x - mean) / sqrt(var + eps) * weight + bias (no bias under the flag no_bias).

norm.rms_fp8 / norm.rms_add_fp8: the same, the normed rows then quantised per token to float8
e4m3 as an FP8 linear's input (runtime_loader.quant.quantize_per_token): (q, scale[,
total]). The reference quantises the fp32 normed rows and returns q's values in fp32.

unit_offset (Gemma, Qwen3.5): the RMS norms scale by (1 + weight), whose trained weights sit
near 0; the canonical call appends True as a last argument only when the signature sets it.
Records, inputs and eager kernels: runtime_loader.ops.norm.
"""
from __future__ import annotations

import torch

from lzsolve.ops.base import FP8_OUT_TOLERANCES, OpContract, itemsize
from runtime_loader.quant import quantize_per_token


def rms(x, weight, eps, unit_offset=False):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + weight if unit_offset else weight)


def rms_add(x, residual, weight, eps, unit_offset=False, keep_inputs=False):
    total = x + residual
    return rms(total, weight, eps, unit_offset), total


def rms_fp8(x, weight, eps, unit_offset=False):
    q, scale = quantize_per_token(rms(x, weight, eps, unit_offset))
    return q.float(), scale


def rms_add_fp8(x, residual, weight, eps, unit_offset=False):
    normed, total = rms_add(x, residual, weight, eps, unit_offset)
    q, scale = quantize_per_token(normed)
    return q.float(), scale, total


def fp8_bytes(row_tensors: int):
    """row_tensors (tokens, hidden) tensors read or written in the activation dtype, q written at a
    byte per element, a scale per token, the weight read once."""
    return lambda sig, dims: float((itemsize(sig) * row_tensors + 1) * sig.dim("hidden") * dims["tokens"]
                                   + 4 * dims["tokens"] + itemsize(sig) * sig.dim("hidden"))


def layer(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    out = (x - mean) * torch.rsqrt(var + eps) * weight
    return out if bias is None else out + bias


def flops(per_element: float):
    return lambda sig, dims: per_element * dims["tokens"] * sig.dim("hidden")


def bytes_moved(row_tensors: int, vectors: int):
    """row_tensors (tokens, hidden) tensors read or written, vectors (hidden,) read once."""
    return lambda sig, dims: float(itemsize(sig) * sig.dim("hidden") * (row_tensors * dims["tokens"] + vectors))


def qk_flops(sig, dims):
    return 4.0 * dims["tokens"] * sig.dim("heads") * sig.dim("d")


def qk_bytes(sig, dims):
    """x read, out written, the (d,) weight read once."""
    return float(itemsize(sig) * sig.dim("d") * (2 * dims["tokens"] * sig.dim("heads") + 1))


RMS_CASES = (({"hidden": 256}, (), {"tokens": 9}), ({"hidden": 8192}, (), {"tokens": 3}),
             ({"hidden": 640}, ("unit_offset",), {"tokens": 9}))
RMS = OpContract("norm.rms", rms, flops(4.0), bytes_moved(2, 1), RMS_CASES)
# keep_inputs: the caller's x and residual must come back as they were (the parity gate checks it)
RMS_ADD = OpContract("norm.rms_add", rms_add, flops(5.0), bytes_moved(4, 1),
                     RMS_CASES + (({"hidden": 640}, ("keep_inputs",), {"tokens": 9}),
                                  ({"hidden": 8192}, ("unit_offset", "keep_inputs"), {"tokens": 3})))
RMS_FP8 = OpContract("norm.rms_fp8", rms_fp8, flops(6.0), fp8_bytes(1), RMS_CASES, tolerances=FP8_OUT_TOLERANCES)
RMS_ADD_FP8 = OpContract("norm.rms_add_fp8", rms_add_fp8, flops(7.0), fp8_bytes(3), RMS_CASES,
                         tolerances=FP8_OUT_TOLERANCES)
QK = OpContract("norm.qk", rms, qk_flops, qk_bytes, (({"heads": 8, "d": 128}, (), {"tokens": 9}),
                                                     ({"heads": 2, "d": 256}, ("unit_offset",), {"tokens": 5})))
def layer_flops(sig, dims):
    """Mean, subtract, square, sum, scale, weight: 6 per element, and the bias add unless no_bias."""
    return (6.0 if "no_bias" in sig.flags else 7.0) * dims["tokens"] * sig.dim("hidden")


def layer_bytes(sig, dims):
    """x read, out written, the weight and (unless no_bias) the bias read once."""
    return bytes_moved(2, 1 if "no_bias" in sig.flags else 2)(sig, dims)


LAYER = OpContract("norm.layer", layer, layer_flops, layer_bytes,
                   (({"hidden": 192}, (), {"tokens": 9}), ({"hidden": 2048}, (), {"tokens": 3})))

CONTRACTS = (RMS, RMS_ADD, RMS_FP8, RMS_ADD_FP8, QK, LAYER)
