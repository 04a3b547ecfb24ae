"""linear: y = x W^T (+ b), W of shape (n, k); linear.fp8: the same with W in float8 e4m3 and x
quantised per token (see fp8_reference); linear.fp8_prequantised: linear.fp8 on an x quantised
beforehand (q and its per-token scales, as norm.rms_fp8 leaves them)."""
from __future__ import annotations

import torch

from lzsolve.ops.base import TOLERANCES, OpContract, Tolerance, itemsize
from runtime_loader.quant import quantize_per_token


def reference(x, weight, bias):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


def flops(sig, dims):
    return 2.0 * dims["tokens"] * sig.dim("k") * sig.dim("n")


def bytes_moved(sig, dims):
    t, k, n = dims["tokens"], sig.dim("k"), sig.dim("n")
    return float(itemsize(sig) * (t * k + k * n + t * n + (n if "bias" in sig.flags else 0)))


LINEAR = OpContract("linear", reference, flops, bytes_moved,
                    (({"k": 64, "n": 48}, ("bias",), {"tokens": 5}), ({"k": 256, "n": 384}, (), {"tokens": 33}),
                     ({"k": 1024, "n": 256}, (), {"tokens": 1})))


# --- FP8 weights (W8A8: e4m3 weights with per-channel or per-tensor scales, activations quantised
# per token on the fly, as vLLM's and transformers' fbgemm / compressed-tensors FP8 linears run) ---
def fp8_reference(x, weight, weight_scale, bias):
    """In fp32 from what the format holds: x quantised per token to e4m3 (the kernel must do the
    same: its error belongs to the format), the weight dequantised, then x W^T (+ b)."""
    q, scale = quantize_per_token(x)
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    out = torch.matmul(q.float() * scale, w.T)
    return out + bias.float() if bias is not None else out


def fp8_bytes(sig, dims):
    """x read and out written in the activation dtype; the weight at one byte per element, its scales."""
    t, k, n = dims["tokens"], sig.dim("k"), sig.dim("n")
    scales = 4 * (n if "per_channel" in sig.flags else 1) + 4 * t
    return float(itemsize(sig) * (t * k + t * n + (n if "bias" in sig.flags else 0)) + k * n + scales)


# per-channel with a bias at a few tokens; per-tensor at a decode size and at a prompt's.
# bf16 half of the dense bound: a W8A8 kernel sits ~0.3% from the reference (bf16 rounding), one
# that skips the activations' quantisation (W8A16, another format) ~2.5% (tests/test_gates.py)
LINEAR_FP8 = OpContract("linear.fp8", fp8_reference, flops, fp8_bytes,
                        (({"k": 64, "n": 48}, ("per_channel", "bias"), {"tokens": 5}),
                         ({"k": 256, "n": 128}, (), {"tokens": 1}),
                         ({"k": 512, "n": 256}, ("per_channel",), {"tokens": 33})),
                        tolerances={**TOLERANCES, "bf16": Tolerance(rel_l2=1e-2, max_rel=2e-2)})


def fp8_prequantised_reference(q, x_scale, weight, weight_scale, bias, out_dtype):
    """In fp32 from what the format holds: q * x_scale, the weight dequantised, then x W^T (+ b)."""
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    out = torch.matmul(q.float() * x_scale.float(), w.T)
    return out + bias.float() if bias is not None else out


def fp8_prequantised_bytes(sig, dims):
    """q read at a byte per element with a scale per token, out written in the activation dtype,
    the weight at a byte per element, its scales."""
    t, k, n = dims["tokens"], sig.dim("k"), sig.dim("n")
    scales = 4 * (n if "per_channel" in sig.flags else 1) + 4 * t
    return float(t * k + itemsize(sig) * (t * n + (n if "bias" in sig.flags else 0)) + k * n + scales)


LINEAR_FP8_PREQUANTISED = OpContract("linear.fp8_prequantised", fp8_prequantised_reference, flops,
                                     fp8_prequantised_bytes, LINEAR_FP8.cases, tolerances=LINEAR_FP8.tolerances)

CONTRACTS = (LINEAR, LINEAR_FP8, LINEAR_FP8_PREQUANTISED)
