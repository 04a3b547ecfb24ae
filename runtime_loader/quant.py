"""FP8 (e4m3) quantisation per token: an FP8 linear's dynamic activation quantisation, which the
FP8 ops' eager kernels, example inputs and references share (and the Triton kernels match)."""
from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value


def quantize_per_token(x):
    """x (..., k) as float8 e4m3 with one fp32 scale per row (amax over 448): an FP8 linear's
    dynamic activation quantisation. Returns (q, scale (..., 1)). The scale is amax times the
    fp32 reciprocal of 448, not amax / 448: torch's CUDA kernels divide by a Python number that
    way and its CPU kernels do not, so a division would make the scale's last bit (and an element
    near a rounding boundary) depend on the device; the Triton kernels multiply alike (row_scale)."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) * (1.0 / E4M3_MAX)
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def quantised_rows_fake(x: Tensor, *args) -> tuple[Tensor, Tensor]:
    """The fake result of norm.rms_fp8: (q like x in float8 e4m3, scale (..., 1) fp32)."""
    return torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device), \
        torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
