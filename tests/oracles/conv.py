"""The conv family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (the conv per token and channel), which tests/test_ops.py checks each
contract's reference against."""
import torch

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 4}, ("silu",), "fp32"), {"batch": 2, "seq": 6}),
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 4}, ("silu", "bias"), "fp32"),
     {"batch": 2, "seq": 1}),
    (Signature.make("conv.causal_depthwise", {"channels": 12, "width": 3}, (), "bf16"), {"batch": 1, "seq": 2}),
]


def conv64(x, weight, bias, state, silu):
    """Each output a dot product of the channel's weights with the last width inputs (zeros before
    the first), written per token and channel; the new state the last width inputs."""
    batch, seq, channels = x.shape
    width = weight.shape[1]
    history = torch.zeros(batch, channels, width, dtype=torch.float64) if state is None else state.double()
    out = torch.empty(batch, seq, channels, dtype=torch.float64)
    for t in range(seq):
        history = torch.cat([history[..., 1:], x[:, t, :, None].double()], dim=-1)  # the window ending at t
        out[:, t] = (history * weight.double()).sum(-1) + (0 if bias is None else bias.double())
    return (out * torch.sigmoid(out) if silu else out), history


INDEPENDENT = {
    "conv.causal_depthwise": conv64,
}
