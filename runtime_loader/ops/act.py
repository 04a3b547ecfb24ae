"""Activations: the gated ones of an MLP (SwiGLU, its FP8-quantised form, GeGLU), tanh-GELU and
Qwen3.5's sigmoid gate. Their records, how a call is read, example inputs and eager kernels.
Contract: lzsolve.ops.act.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES
from ..inputs import randn
from ..quant import quantised_rows_fake, quantize_per_token
from ..specs import BOTH, KernelSpec
from .base import OpSchema, promoted_like_first, rows_op, rows_op_call

UP = ("up",)  # tuned in gate's dtype (OpSchema.same_dtype): an fp32 up with a bf16 gate is PyTorch's promotion
# (transformers' act_fn(gate) * up: fp32), which the fallback and the fake (promoted_like_first) both give


def gated_front(gate: Tensor, up: Tensor):
    """gate and up: (..., width); the kernel their first argument decides (up: its dtype, UP)."""
    return (gate.shape, gate.dtype, up.dtype, gate.is_cuda), (gate, up)


def one_input_front(x: Tensor):
    return (x.shape, x.dtype, x.is_cuda), (x,)


# --- example inputs ---------------------------------------------------------------------------------
def gated_inputs(sig, dims, device, gen):
    """Gate and up as the two halves of one (tokens, 2 * width) buffer, as a fused gate_up
    projection hands them over: kernels are checked and timed on those strided views."""
    width = sig.dim("width")
    gate_up = randn((dims["tokens"], 2 * width), sig, device, gen)
    return gate_up[:, :width], gate_up[:, width:]


def two_rows_inputs(sig, dims, device, gen):
    """Two separate (tokens, width) tensors (sigmoid_gate: the gate is split from q per head and
    reshaped, which copies it)."""
    width = sig.dim("width")
    return randn((dims["tokens"], width), sig, device, gen), randn((dims["tokens"], width), sig, device, gen)


def one_row_inputs(sig, dims, device, gen):
    return (randn((dims["tokens"], sig.dim("width")), sig, device, gen),)


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def swiglu(gate, up):
    return F.silu(gate) * up


def geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def gelu(x):
    return F.gelu(x, approximate="tanh")


def swiglu_fp8(gate, up):
    """The SwiGLU, then the per-token quantisation: as rms_norm_fp8, its output rounded first."""
    return quantize_per_token(swiglu(gate, up))


def sigmoid_gate(x, gate):
    return x * torch.sigmoid(gate)


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    rows_op("act.swiglu", "width", "eager.swiglu", "swiglu", gated_front, gated_inputs, UP, promoted_like_first),
    # the SwiGLU before an FP8 linear (down_proj), its output quantised per token in the same pass:
    # (q, scale (..., 1) fp32), as norm.rms_fp8
    OpSchema("act.swiglu_fp8", ("width",), (), ("tokens",), "eager.swiglu_fp8", method="swiglu_fp8",
             front=gated_front, call=rows_op_call("act.swiglu_fp8"), inputs=gated_inputs, fake=quantised_rows_fake,
             same_dtype=UP),
    rows_op("act.geglu", "width", "eager.geglu", "geglu", gated_front, gated_inputs, UP, promoted_like_first),
    rows_op("act.gelu", "width", "eager.gelu", "gelu", one_input_front, one_row_inputs),
    rows_op("act.sigmoid_gate", "width", "eager.sigmoid_gate", "sigmoid_gate", gated_front, two_rows_inputs, UP,
            promoted_like_first),
)


SPECS = [
    KernelSpec("eager.swiglu_fp8", frozenset({"act.swiglu_fp8"}), "torch", swiglu_fp8, platforms=BOTH,
               dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.swiglu", frozenset({"act.swiglu"}), "torch", swiglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.geglu", frozenset({"act.geglu"}), "torch", geglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.gelu", frozenset({"act.gelu"}), "torch", gelu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.sigmoid_gate", frozenset({"act.sigmoid_gate"}), "torch", sigmoid_gate,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
]
