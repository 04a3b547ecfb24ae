"""conv.causal_depthwise: the short causal depthwise conv1d (with SiLU) of Qwen3.5's linear-attention layers.

Canonical call causal_conv1d(x, weight, bias, state, silu) with x (batch, seq, channels), weight
(channels, width), bias (channels) or None, state (batch, channels, width) or None: the last
width inputs before x, oldest first (None: zeros, a prompt from the start). Each output channel
c at token t is sum_j weight[c, j] * x'[c, t - width + 1 + j] over the inputs x' = state then x,
plus bias, then SiLU if silu. Returns (out (batch, seq, channels) in x's dtype, the new state:
the last width inputs of x', in x's dtype). A kernel may roll the state it was handed in place
and return it (as FLA's and causal-conv1d's update kernels do); the caller keeps what it returns.
Inputs: a prompt from no state (seq > 1), a decode step (seq == 1) on a rolling state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lzsolve.ops.base import OpContract, itemsize
from runtime_loader.inputs import starts_from_state


def reference(x, weight, bias, state, silu):
    batch, seq, channels = x.shape
    width = weight.shape[1]
    past = torch.zeros(batch, width, channels, device=x.device) if state is None else state.transpose(1, 2)
    inputs = torch.cat([past, x], dim=1)  # (batch, width + seq, channels)
    out = sum(weight[:, j] * inputs[:, 1 + j:1 + j + seq] for j in range(width))  # tap j reads t - width + 1 + j
    if bias is not None:
        out = out + bias
    return (F.silu(out) if silu else out), inputs[:, -width:].transpose(1, 2)


def flops(sig, dims):
    """Per output: a multiply-add per tap (2 width), the bias add (1) with bias, the SiLU (~4) with silu."""
    per_output = 2.0 * sig.dim("width") + ("bias" in sig.flags) + 4.0 * ("silu" in sig.flags)
    return per_output * dims["batch"] * dims["seq"] * sig.dim("channels")


def bytes_moved(sig, dims):
    """x read and out written; the state written (and read when the call starts from one); the
    (channels, width) weight and the bias read once."""
    channels, width = sig.dim("channels"), sig.dim("width")
    states = 2 if starts_from_state(dims) else 1
    params = channels * (width + ("bias" in sig.flags))
    return float(itemsize(sig) * (channels * (2 * dims["batch"] * dims["seq"] + states * dims["batch"] * width)
                                  + params))


# a prompt longer and shorter than the kernel (zero history), a decode step on a state, a bias
CASES = (({"channels": 96, "width": 4}, ("silu",), {"batch": 2, "seq": 37}),
         ({"channels": 96, "width": 4}, ("silu",), {"batch": 3, "seq": 1}),
         ({"channels": 40, "width": 4}, ("silu", "bias"), {"batch": 1, "seq": 3}),
         ({"channels": 40, "width": 3}, (), {"batch": 2, "seq": 1}))
CAUSAL_DEPTHWISE = OpContract("conv.causal_depthwise", reference, flops, bytes_moved, CASES)

CONTRACTS = (CAUSAL_DEPTHWISE,)
