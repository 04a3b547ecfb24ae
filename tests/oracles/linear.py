"""The linear family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (GEMMs and FP8 GEMMs), which tests/test_ops.py checks each
contract's reference against."""

from runtime_loader.ops import Signature

from . import quantised64

SIGS = [
    (Signature.make("linear", {"k": 16, "n": 12}, ("bias",), "fp32"), {"tokens": 4}),
    (Signature.make("linear", {"k": 16, "n": 12}, (), "fp32"), {"tokens": 4}),
    (Signature.make("linear.fp8", {"k": 32, "n": 12}, ("per_channel", "bias"), "bf16"), {"tokens": 4}),
    (Signature.make("linear.fp8", {"k": 32, "n": 12}, (), "fp32"), {"tokens": 3}),
    (Signature.make("linear.fp8_prequantised", {"k": 32, "n": 12}, ("per_channel", "bias"), "bf16"), {"tokens": 4}),
]


def fp8_linear64(x, weight, scale, bias):
    """Each token's row divided by its amax / 448 and cast to e4m3 (in fp32, as the format is
    defined), then every product and sum in float64."""
    q, step = quantised64(x)
    out = (q * step) @ (weight.double() * scale.double().reshape(-1, 1)).T
    return out + bias.double() if bias is not None else out


INDEPENDENT = {
    "linear": lambda x, w, b: x.double() @ w.double().T + (b.double() if b is not None else 0),
    "linear.fp8": fp8_linear64,
    "linear.fp8_prequantised": lambda q, x_scale, w, w_scale, b, out_dtype: (
        (q.double() * x_scale.double()) @ (w.double() * w_scale.double().reshape(-1, 1)).T
        + (b.double() if b is not None else 0)),
}
