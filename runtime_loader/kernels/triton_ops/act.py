"""SwiGLU, GeGLU, GELU (tanh approximation) and the sigmoid output gate, elementwise over (row, BLOCK-wide chunk) tiles.

Gate and up are read through their row strides: they usually arrive as the two halves
of one (tokens, 2 * width) gate_up buffer, and copying them apart would cost as much
memory traffic as the kernel itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import as_rows

@triton.jit
def _activation_kernel(x_ptr, up_ptr, out_ptr, x_stride_row, x_stride_col, up_stride_row, up_stride_col,
                       out_stride_row, n_cols, BLOCK: tl.constexpr, ACTIVATION: tl.constexpr):
    """out = act(x), times up when up_ptr is given; in fp32, rounded once."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride_row + cols * x_stride_col, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == "silu":
        y = x * tl.sigmoid(x)
    elif ACTIVATION == "sigmoid":
        y = tl.sigmoid(x)
    else:  # gelu_tanh, 0.5 x (1 + tanh(z)) with z = sqrt(2/pi) (x + 0.044715 x^3), written as
        # x sigmoid(2z): the same function, with no tanh to import and no cancellation near z = 0
        y = x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    if up_ptr is not None:
        y *= tl.load(up_ptr + row * up_stride_row + cols * up_stride_col, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _activation(x, up, activation: str, block: int, warps: int):
    if up is not None and up.shape != x.shape:
        raise ValueError(f"gate {tuple(x.shape)} and up {tuple(up.shape)} differ in shape")
    rows = as_rows(x)
    up_rows = as_rows(up) if up is not None else None
    n_rows, n_cols = rows.shape
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        up_strides = up_rows.stride() if up_rows is not None else (0, 0)
        _activation_kernel[(n_rows, triton.cdiv(n_cols, block))](
            rows, up_rows, out, *rows.stride(), *up_strides, out.stride(0), n_cols,
            BLOCK=block, ACTIVATION=activation, num_warps=warps)
    return out.view(x.shape)


def swiglu(gate, up, *, block: int, warps: int):
    return _activation(gate, up, "silu", block, warps)


def geglu(gate, up, *, block: int, warps: int):
    return _activation(gate, up, "gelu_tanh", block, warps)


def gelu(x, *, block: int, warps: int):
    return _activation(x, None, "gelu_tanh", block, warps)


def sigmoid_gate(x, gate, *, block: int, warps: int):
    """x * sigmoid(gate): the gate is the activated input, x the multiplier."""
    return _activation(gate, x, "sigmoid", block, warps)
