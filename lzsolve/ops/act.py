"""act.swiglu: silu(gate) * up."""
from __future__ import annotations

import torch.nn.functional as F

from .base import OpContract, itemsize, randn


def make_inputs(sig, dims, device, gen):
    shape = (dims["tokens"], sig.dim("width"))
    return randn(shape, sig, device, gen), randn(shape, sig, device, gen)


def reference(gate, up):
    return F.silu(gate) * up


def flops(sig, dims):
    return 5.0 * dims["tokens"] * sig.dim("width")


def bytes_moved(sig, dims):
    return float(itemsize(sig) * 3 * dims["tokens"] * sig.dim("width"))


SWIGLU = OpContract("act.swiglu", make_inputs, reference, flops, bytes_moved)
