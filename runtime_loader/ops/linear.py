"""GEMMs: the linear layer, and FP8 (W8A8) linears with activations quantised on the fly or
beforehand. Their records, how a call is read, example inputs and eager kernels (the bf16
linear's fallback is torch.linear, runtime_loader.kernels.torch_ops). Contract: lzsolve.ops.linear.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES, DTYPES
from ..inputs import randn
from ..quant import quantize_per_token
from ..specs import BOTH, KernelSpec
from .base import OpSchema, Signature


def linear_front(x: Tensor, weight: Tensor, bias: Tensor | None = None):
    """x @ weight.T (+ bias), weight (n, k)."""
    return (x.shape, weight.shape, bias is None, x.dtype, x.is_cuda), (x, weight, bias)


def linear_call(x, weight, bias=None):
    if x.dtype not in DTYPE_NAMES or weight.dim() != 2 or x.dim() == 0:
        return None
    n, k = weight.shape
    flags = ("bias",) if bias is not None else ()
    return Signature.make("linear", {"k": k, "n": n}, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(k, 1)}


def linear_fake(x: Tensor, weight: Tensor, *args) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_fp8_front(x: Tensor, weight: Tensor, weight_scale: Tensor, bias: Tensor | None = None):
    """x @ dequant(weight).T (+ bias) with weight (n, k) in float8 e4m3 and weight_scale (n,) per
    output channel or (1,) per tensor (fp32); x is quantised per token on the fly (W8A8). Returns x's dtype."""
    return ((x.shape, weight.shape, weight_scale.numel(), bias is None, x.dtype, x.is_cuda),
            (x, weight, weight_scale, bias))


def linear_fp8_call(x, weight, weight_scale, bias=None):
    if (x.dtype not in DTYPE_NAMES or weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn or x.dim() == 0
            or weight_scale.numel() not in (1, weight.shape[0])):
        return None
    n, k = weight.shape
    flags = [name for name, on in (("per_channel", weight_scale.numel() > 1), ("bias", bias is not None)) if on]
    return (Signature.make("linear.fp8", {"k": k, "n": n}, flags, DTYPE_NAMES[x.dtype]),
            {"tokens": x.numel() // max(k, 1)})


def linear_fp8_prequantised_front(q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor,
                                  bias: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
    """linear_fp8 of an input already quantised per token (by norm.rms_fp8, say): q (..., k) in
    float8 e4m3 with x_scale (..., 1) fp32, so q * x_scale ~ x; returns out_dtype."""
    return ((q.shape, weight.shape, weight_scale.numel(), bias is None, out_dtype, q.is_cuda),
            (q, x_scale, weight, weight_scale, bias, out_dtype))


def linear_fp8_prequantised_call(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16):
    if (out_dtype not in DTYPE_NAMES or q.dtype != torch.float8_e4m3fn or weight.dim() != 2 or q.dim() == 0
            or weight.dtype != torch.float8_e4m3fn or weight_scale.numel() not in (1, weight.shape[0])
            or x_scale.numel() * q.shape[-1] != q.numel()):
        return None
    n, k = weight.shape
    flags = [name for name, on in (("per_channel", weight_scale.numel() > 1), ("bias", bias is not None)) if on]
    return (Signature.make("linear.fp8_prequantised", {"k": k, "n": n}, flags, DTYPE_NAMES[out_dtype]),
            {"tokens": q.numel() // max(k, 1)})


def linear_prequantised_fake(q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor,
                             bias: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return torch.empty((*q.shape[:-1], weight.shape[0]), dtype=out_dtype, device=q.device)


# --- example inputs ---------------------------------------------------------------------------------
def linear_inputs(sig, dims, device, gen):
    k, n = sig.dim("k"), sig.dim("n")
    x = randn((dims["tokens"], k), sig, device, gen)
    weight = randn((n, k), sig, device, gen, scale=k ** -0.5)  # keeps outputs O(1)
    bias = randn((n,), sig, device, gen) if "bias" in sig.flags else None
    return x, weight, bias


def linear_fp8_inputs(sig, dims, device, gen):
    """A bf16-like weight quantised as FP8 checkpoints store it: e4m3 with a scale per output
    channel (amax / 448) or one for the whole tensor."""

    k, n = sig.dim("k"), sig.dim("n")
    x = randn((dims["tokens"], k), sig, device, gen)
    weight = torch.randn((n, k), generator=gen, device=device) * k ** -0.5
    quantized, scale = quantize_per_token(weight if "per_channel" in sig.flags else weight.reshape(1, -1))
    bias = randn((n,), sig, device, gen) if "bias" in sig.flags else None
    return x, quantized.reshape(n, k), scale.reshape(-1), bias


def linear_fp8_prequantised_inputs(sig, dims, device, gen):
    """linear_fp8's, x quantised per token as norm.rms_fp8 leaves it; the output dtype last."""

    x, weight, weight_scale, bias = linear_fp8_inputs(sig, dims, device, gen)
    return (*quantize_per_token(x), weight, weight_scale, bias, DTYPES[sig.dtype])


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def linear(x, weight, bias=None):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


def linear_fp8(x, weight, weight_scale, bias=None):
    """The baseline any device runs: x quantised per token and dequantised (the format's rounding),
    the weight dequantised, both in x's dtype, then one GEMM (a full pass over the weight per call)."""
    q, scale = quantize_per_token(x)
    w = (weight.to(x.dtype) * weight_scale.to(x.dtype).reshape(-1, 1))
    return F.linear((q.float() * scale).to(x.dtype), w, bias)


def linear_fp8_prequantised(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16):
    """linear_fp8's baseline on an input quantised beforehand: both dequantised to out_dtype, one GEMM."""
    w = weight.to(out_dtype) * weight_scale.to(out_dtype).reshape(-1, 1)
    return F.linear((q.float() * x_scale).to(out_dtype), w, bias)


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    OpSchema("linear", ("k", "n"), ("bias",), ("tokens",), "torch.linear", method="linear", front=linear_front,
             call=linear_call, inputs=linear_inputs, fake=linear_fake),
    # weights in float8 e4m3 (W8A8, activations quantised per token); per_channel: one weight scale per
    # output channel, else one per tensor
    OpSchema("linear.fp8", ("k", "n"), ("per_channel", "bias"), ("tokens",), "eager.linear_fp8",
             method="linear_fp8", front=linear_fp8_front, call=linear_fp8_call, inputs=linear_fp8_inputs,
             fake=linear_fake),
    # the same with x quantised beforehand (norm.rms_fp8 fuses it into the norm): the output dtype is the signature's
    OpSchema("linear.fp8_prequantised", ("k", "n"), ("per_channel", "bias"), ("tokens",),
             "eager.linear_fp8_prequantised", method="linear_fp8_prequantised", front=linear_fp8_prequantised_front,
             call=linear_fp8_prequantised_call, inputs=linear_fp8_prequantised_inputs, fake=linear_prequantised_fake),
)


SPECS = [
    KernelSpec("eager.linear", frozenset({"linear"}), "torch", linear, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"bias"}), graph_safe=True, notes="matmul, then a separate bias add"),
    KernelSpec("eager.linear_fp8", frozenset({"linear.fp8"}), "torch", linear_fp8, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"per_channel", "bias"}), graph_safe=True,
               notes="dequantise x (quantised per token) and the weight, then a GEMM in x's dtype"),
    KernelSpec("eager.linear_fp8_prequantised", frozenset({"linear.fp8_prequantised"}), "torch", linear_fp8_prequantised,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"per_channel", "bias"}), graph_safe=True,
               notes="dequantise x and the weight, then a GEMM in the output dtype"),
]
