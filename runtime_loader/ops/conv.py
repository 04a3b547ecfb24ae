"""Qwen3.5's short causal depthwise conv1d (before its Gated DeltaNet): its record, how a call is
read, example inputs and eager kernels. Contract: lzsolve.ops.conv.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES
from ..inputs import randn, starts_from_state
from ..specs import BOTH, KernelSpec
from .base import OpSchema, Signature
from .recurrent import SEQUENCE_BUCKETS


def causal_conv1d_front(x: Tensor, weight: Tensor, bias: Tensor | None = None, state: Tensor | None = None,
                        silu: bool = True):
    """Qwen3.5's short causal depthwise conv1d: x (batch, seq, channels), weight (channels,
    width), state (batch, channels, width) the inputs before x or None (zeros); returns (out
    (batch, seq, channels), the new state). The state is consumed: a kernel may roll it in
    place. See lzsolve.ops.conv for the conventions."""
    return ((x.shape, x.stride(), weight.shape, x.dtype, x.is_cuda, bias is None, state is None, silu),
            (x, weight, bias, state, silu))


def causal_conv1d_call(x, weight, bias=None, state=None, silu=True):
    if (x.dim() != 3 or weight.dim() != 2 or x.dtype not in DTYPE_NAMES or weight.shape[0] != x.shape[2]
            or (state is not None and state.shape != (x.shape[0], x.shape[2], weight.shape[1]))):
        return None
    flags = [name for name, on in (("silu", silu), ("bias", bias is not None)) if on]
    static = {"channels": x.shape[2], "width": weight.shape[1]}
    return (Signature.make("conv.causal_depthwise", static, flags, DTYPE_NAMES[x.dtype]),
            {"batch": x.shape[0], "seq": x.shape[1]})


def causal_conv1d_fake(x: Tensor, weight: Tensor, *args) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty((x.shape[0], x.shape[2], weight.shape[1]))


# --- example inputs ---------------------------------------------------------------------------------
def causal_conv1d_inputs(sig, dims, device, gen):
    """x as a projection hands it over; weights of a conv1d's default init scale (1 / sqrt(width));
    a decode step's state holds the previous inputs (of x's scale)."""
    channels, width = sig.dim("channels"), sig.dim("width")
    batch, seq = dims["batch"], dims["seq"]
    x = randn((batch, seq, channels), sig, device, gen)
    weight = randn((channels, width), sig, device, gen, scale=width ** -0.5)
    bias = randn((channels,), sig, device, gen, scale=0.1) if "bias" in sig.flags else None
    state = randn((batch, channels, width), sig, device, gen) if starts_from_state(dims) else None
    return x, weight, bias, state, "silu" in sig.flags


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def causal_conv1d(x, weight, bias, state, silu: bool):
    """As transformers' Qwen3.5 runs it without causal-conv1d: F.conv1d over channels-first
    inputs (zero-padded when there is no state), then SiLU. x: (batch, seq, channels); state
    (batch, channels, width) or None. Returns (out, the new state: the last width inputs)."""
    seq, width = x.shape[1], weight.shape[1]
    inputs = x.transpose(1, 2)  # (batch, channels, seq): a view
    if state is not None:
        inputs = torch.cat([state.to(x.dtype), inputs], dim=-1)
    if inputs.shape[-1] == 0:  # no state and no tokens: F.conv1d refuses a length-0 input; eager's output is empty
        out = inputs.new_empty(inputs.shape)
    else:
        # with no state, the zero history is conv1d's padding (on both sides: the first seq outputs are the causal
        # ones); with one, the last seq outputs (not [-seq:], all of them at seq 0: the first is the state's own)
        out = F.conv1d(inputs, weight[:, None], bias, padding=0 if state is not None else width - 1,
                       groups=weight.shape[0])
        out = out[..., out.shape[-1] - seq:] if state is not None else out[..., :seq]
    if silu:
        out = F.silu(out)
    new_state = inputs[..., -width:] if inputs.shape[-1] >= width else F.pad(inputs, (width - inputs.shape[-1], 0))
    return out.transpose(1, 2), new_state.contiguous()


def causal_conv1d_taps(x, weight, bias, state, silu: bool):
    """The same conv as width shifted multiply-adds over (batch, seq, channels): elementwise, so
    torch.compile fuses it into one kernel (Inductor cannot lower conv1d over an unbacked length)."""
    seq, width = x.shape[1], weight.shape[1]
    history = F.pad(x, (0, 0, width, 0)) if state is None else torch.cat([state.transpose(1, 2).to(x.dtype), x], 1)
    out = sum(weight[:, j].float() * history[:, 1 + j:1 + j + seq].float() for j in range(width))
    if bias is not None:
        out = out + bias.float()
    out = F.silu(out) if silu else out
    return out.to(x.dtype), history[:, -width:].transpose(1, 2).contiguous()


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    # the causal depthwise conv1d before it: width taps per channel; silu: SiLU after; bias: a bias per channel
    # the tuner's buckets: those of the recurrence it precedes (a decode step at seq 1)
    OpSchema("conv.causal_depthwise", ("channels", "width"), ("silu", "bias"), ("batch", "seq"),
             "eager.causal_conv1d", method="causal_conv1d", front=causal_conv1d_front, call=causal_conv1d_call,
             inputs=causal_conv1d_inputs, fake=causal_conv1d_fake, consumes=("state",),
             buckets=SEQUENCE_BUCKETS),
)


SPECS = [
    KernelSpec("eager.causal_conv1d", frozenset({"conv.causal_depthwise"}), "torch", causal_conv1d, platforms=BOTH,
               dtypes=ALL_DTYPES, features=frozenset({"silu", "bias"}), graph_safe=True, deterministic=True,
               notes="F.conv1d (depthwise, channels first) then SiLU, as transformers runs it"),
]
