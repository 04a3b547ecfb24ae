"""Gated and plain activations over the last dim.

act.swiglu: silu(gate) * up; act.geglu: gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh);
act.gelu: gelu_tanh(x) (GPT-2's gelu_new); act.sigmoid_gate: x * sigmoid(gate) (Qwen3.5's
gated attention: the attention output times the sigmoid of a gate projected along with q).
Inputs (runtime_loader.inputs): gate and up as the two halves of one (tokens, 2 * width) buffer,
because that is what a fused gate_up projection hands them over as.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import OpContract, itemsize


def swiglu(gate, up):
    return F.silu(gate) * up


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
GEGLU = OpContract("act.geglu", geglu, flops_per_element(9.0), bytes_per_element(3), cases(3584))
GELU = OpContract("act.gelu", gelu, flops_per_element(8.0), bytes_per_element(2), cases(3072))
SIGMOID_GATE = OpContract("act.sigmoid_gate", sigmoid_gate, flops_per_element(5.0), bytes_per_element(3),
                          cases(4096))
