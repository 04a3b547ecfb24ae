"""Gated and plain activations over the last dim.

act.swiglu: silu(gate) * up; act.geglu: gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh);
act.gelu: gelu_tanh(x) (GPT-2's gelu_new); act.sigmoid_gate: x * sigmoid(gate) (Qwen3.5's
gated attention: the attention output times the sigmoid of a gate projected along with q).
act.swiglu_fp8: the SwiGLU quantised per token to float8 e4m3 as an FP8 linear's input,
(q, scale); the reference returns q's values in fp32.
Inputs (runtime_loader.ops.act): gate and up as the two halves of one (tokens, 2 * width) buffer,
because that is what a fused gate_up projection hands them over as.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lzsolve.ops.base import FP8_OUT_TOLERANCES, OpContract, itemsize
from runtime_loader.quant import quantize_per_token


def swiglu(gate, up):
    return F.silu(gate) * up


def swiglu_fp8(gate, up):
    q, scale = quantize_per_token(swiglu(gate, up))
    return q.float(), scale


def geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def gelu(x):
    return F.gelu(x, approximate="tanh")


def sigmoid_gate(x, gate):
    return x * torch.sigmoid(gate)


def flops_per_element(per_element: float):
    return lambda sig, dims: per_element * dims["tokens"] * sig.dim("width")


def bytes_per_element(tensors: int):
    return lambda sig, dims: float(itemsize(sig) * tensors * dims["tokens"] * sig.dim("width"))


def cases(wide: int) -> tuple:
    """An odd width at a few tokens, and a model's width at decode-like token counts."""
    return ({"width": 96}, (), {"tokens": 7}), ({"width": wide}, (), {"tokens": 2})


SWIGLU = OpContract("act.swiglu", swiglu, flops_per_element(5.0), bytes_per_element(3), cases(3584))
# gate and up read in the activation dtype, q written at a byte per element, a scale per token
SWIGLU_FP8 = OpContract("act.swiglu_fp8", swiglu_fp8, flops_per_element(6.0),
                        lambda sig, dims: float((2 * itemsize(sig) + 1) * dims["tokens"] * sig.dim("width")
                                                + 4 * dims["tokens"]),
                        cases(3584), tolerances=FP8_OUT_TOLERANCES)
GEGLU = OpContract("act.geglu", geglu, flops_per_element(9.0), bytes_per_element(3), cases(3584))
GELU = OpContract("act.gelu", gelu, flops_per_element(8.0), bytes_per_element(2), cases(3072))
SIGMOID_GATE = OpContract("act.sigmoid_gate", sigmoid_gate, flops_per_element(5.0), bytes_per_element(3),
                          cases(4096))

CONTRACTS = (SWIGLU, SWIGLU_FP8, GEGLU, GELU, SIGMOID_GATE)
