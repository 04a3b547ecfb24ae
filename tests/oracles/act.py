"""The act family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (activations written out), which tests/test_ops.py checks each
contract's reference against."""
import math

import torch

from runtime_loader.ops import Signature

from . import quantised64

SIGS = [
    (Signature.make("act.swiglu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.swiglu_fp8", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.sigmoid_gate", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.geglu", {"width": 24}, (), "fp32"), {"tokens": 3}),
    (Signature.make("act.gelu", {"width": 24}, (), "fp32"), {"tokens": 3}),
]


def gelu64(x):
    """GELU's tanh approximation, written out."""
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


INDEPENDENT = {
    "act.swiglu": lambda g, u: g.double() * torch.sigmoid(g.double()) * u.double(),
    "act.sigmoid_gate": lambda x, g: x.double() / (1 + torch.exp(-g.double())),
    "act.swiglu_fp8": lambda g, u: quantised64(g.double() * torch.sigmoid(g.double()) * u.double()),
    "act.geglu": lambda g, u: gelu64(g) * u.double(),
    "act.gelu": gelu64,
}
