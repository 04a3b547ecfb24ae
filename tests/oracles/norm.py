"""The norm family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (norms), which tests/test_ops.py checks each
contract's reference against."""
import torch

from runtime_loader.ops import Signature

from . import quantised64

SIGS = [
    (Signature.make("norm.rms", {"hidden": 32}, (), "fp32"), {"tokens": 5}),
    (Signature.make("norm.rms", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 5}),
    (Signature.make("norm.rms_add", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 3}),
    (Signature.make("norm.rms_fp8", {"hidden": 32}, (), "fp32"), {"tokens": 3}),
    (Signature.make("norm.rms_add_fp8", {"hidden": 32}, ("unit_offset",), "fp32"), {"tokens": 3}),
    (Signature.make("norm.qk", {"heads": 3, "d": 16}, (), "fp32"), {"tokens": 4}),
    (Signature.make("norm.qk", {"heads": 3, "d": 16}, ("unit_offset",), "fp32"), {"tokens": 4}),
    (Signature.make("norm.layer", {"hidden": 32}, (), "fp32"), {"tokens": 5}),
    (Signature.make("norm.layer", {"hidden": 32}, ("no_bias",), "fp32"), {"tokens": 5}),
]


def rms64(x, w, eps, unit_offset=False):
    x = x.double()
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * (w.double() + (1 if unit_offset else 0))


def layer64(x, w, b, eps):
    x = x.double()
    centred = x - x.mean(-1, keepdim=True)
    out = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + eps) * w.double()
    return out if b is None else out + b.double()


def rms_fp8_64(x, weight, eps, unit_offset=False):
    return quantised64(rms64(x, weight, eps, unit_offset))


INDEPENDENT = {
    "norm.rms": rms64,
    "norm.rms_add": lambda x, r, w, eps, unit_offset=False: (rms64(x.double() + r.double(), w, eps, unit_offset),
                                                             x.double() + r.double()),
    "norm.rms_fp8": rms_fp8_64,
    "norm.rms_add_fp8": lambda x, r, w, eps, unit_offset=False: (
        *rms_fp8_64(x.double() + r.double(), w, eps, unit_offset), x.double() + r.double()),
    "norm.qk": rms64,
    "norm.layer": layer64,
}
