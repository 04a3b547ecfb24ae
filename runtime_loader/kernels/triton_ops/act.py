"""SwiGLU, GeGLU, GELU (tanh approximation) and the sigmoid output gate, elementwise over (row, BLOCK-wide chunk) tiles;
the SwiGLU before an FP8 linear (act.swiglu_fp8) a row per program, for the row's scale.

Gate and up are read through their row strides: they usually arrive as the two halves
of one (tokens, 2 * width) gate_up buffer, and copying them apart would cost as much
memory traffic as the kernel itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...quant import E4M3_MAX
from .fp8 import row_scale, store_quantised
from .launch import launcher
from .layout import as_rows, row_tiling


@launcher
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


@triton.jit
def _silu_times_up(gate_ptr, up_ptr, gate_offsets, up_offsets, mask):
    g = tl.load(gate_ptr + gate_offsets, mask=mask, other=0.0).to(tl.float32)
    return g * tl.sigmoid(g) * tl.load(up_ptr + up_offsets, mask=mask, other=0.0).to(tl.float32)


@launcher
@triton.jit
def _swiglu_fp8_kernel(gate_ptr, up_ptr, q_ptr, scale_ptr, gate_stride_row, gate_stride_col, up_stride_row,
                       up_stride_col, n_cols, E4M3: tl.constexpr, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    """silu(gate) * up of one row in fp32, quantised to e4m3 with the row's scale amax / E4M3 as
    kernels/triton_ops/fp8.py quantises; q a contiguous (rows, n_cols). A row wider than BLOCK is
    walked twice (its amax, then the store)."""
    row = tl.program_id(0).to(tl.int64)
    gate_row, up_row = row * gate_stride_row, row * up_stride_row
    if ONE_TILE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        y = _silu_times_up(gate_ptr, up_ptr, gate_row + cols * gate_stride_col, up_row + cols * up_stride_col, mask)
        scale = row_scale(tl.abs(y), E4M3)
        tl.store(scale_ptr + row, scale)
        store_quantised(q_ptr + row * n_cols + cols, y, scale, mask, E4M3)
    else:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            y = _silu_times_up(gate_ptr, up_ptr, gate_row + cols * gate_stride_col, up_row + cols * up_stride_col,
                               cols < n_cols)
            amax = tl.maximum(amax, tl.abs(y))
        scale = row_scale(amax, E4M3)
        tl.store(scale_ptr + row, scale)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            y = _silu_times_up(gate_ptr, up_ptr, gate_row + cols * gate_stride_col, up_row + cols * up_stride_col,
                               mask)
            store_quantised(q_ptr + row * n_cols + cols, y, scale, mask, E4M3)


def swiglu_fp8(gate, up, *, block: int, warps: int):
    """act.swiglu_fp8 in one pass: (q shaped like gate, scale (..., 1))."""
    if up.shape != gate.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    rows, up_rows = as_rows(gate), as_rows(up)
    n_rows, n_cols = rows.shape
    q = torch.empty(rows.shape, dtype=torch.float8_e4m3fn, device=gate.device)
    scale = torch.empty((n_rows, 1), dtype=torch.float32, device=gate.device)
    if q.numel():
        _swiglu_fp8_kernel[(n_rows,)](rows, up_rows, q, scale, *rows.stride(), *up_rows.stride(), n_cols,
                                      E4M3=E4M3_MAX, **row_tiling(n_cols, block), num_warps=warps)
    return q.view(gate.shape), scale.view(*gate.shape[:-1], 1)


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
