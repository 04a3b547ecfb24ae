"""RMSNorm (with and without the fused residual add) and LayerNorm, one row per program.

A row that fits in the tile (a configuration's block, narrowed to the row's own power of two:
layout.row_tile) is read once and kept in registers; a longer one is walked in block-wide chunks,
once per statistic and once more to write, so block is a real tuning knob (register pressure
against extra passes over the row, which L2 mostly serves). Statistics are in fp32 whatever the
input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...quant import E4M3_MAX
from .fp8 import row_scale, store_quantised
from .launch import launcher
from .layout import as_rows, row_tiling


@triton.jit
def _load_total(x_ptr, x_offsets, res_ptr, res_offsets, mask):
    """A chunk of the row in fp32: x, or x + residual rounded to the input dtype, as eager's
    `x + residual` is; that rounded total is what gets normalised and written back."""
    x = tl.load(x_ptr + x_offsets, mask=mask, other=0.0)
    if res_ptr is not None:
        residual = tl.load(res_ptr + res_offsets, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
    return x.to(tl.float32)


@triton.jit
def _normed(total, rstd, cols, mask, w_ptr, w_stride, like_ptr, UNIT_OFFSET: tl.constexpr):
    """A chunk of the normed row in fp32, before its final rounding."""
    weight = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
    if UNIT_OFFSET:  # Gemma: scaled by (1 + weight) in fp32, rounded once at the end
        return total * rstd * (1.0 + weight)
    # rounded to the activations' dtype before the weight multiplies, as Hugging Face's LlamaRMSNorm does
    return (total * rstd).to(like_ptr.dtype.element_ty).to(tl.float32) * weight


@triton.jit
def _store_total(total, mask, sum_ptr, sum_offsets):
    if sum_ptr is not None:  # the residual's storage in place (vLLM's fused_add_rms_norm does the same), or a new one
        tl.store(sum_ptr + sum_offsets, total.to(sum_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_rms(total, rstd, cols, mask, w_ptr, w_stride, out_ptr, out_offsets, sum_ptr, sum_offsets,
               UNIT_OFFSET: tl.constexpr):
    _store_total(total, mask, sum_ptr, sum_offsets)
    out = _normed(total, rstd, cols, mask, w_ptr, w_stride, out_ptr, UNIT_OFFSET)
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunked_rstd(x_ptr, res_ptr, row, x_stride_row, x_stride_col, res_stride_row, res_stride_col, n_cols, eps,
                  BLOCK: tl.constexpr):
    """1 / rms of a row (of x + residual when res_ptr is given) too wide for one tile, chunk by chunk."""
    sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total = _load_total(x_ptr, row * x_stride_row + cols * x_stride_col,
                            res_ptr, row * res_stride_row + cols * res_stride_col, cols < n_cols)
        sum_sq += total * total
    return tl.rsqrt(tl.sum(sum_sq) / n_cols + eps)


@launcher
@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
                     x_stride_row, x_stride_col, res_stride_row, res_stride_col, w_stride,
                     out_stride_row, out_stride_col, sum_stride_row, sum_stride_col, n_cols, eps,
                     BLOCK: tl.constexpr, ONE_TILE: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """rms_norm of one row of x, or of x + residual when res_ptr is given; that total is written
    at sum_ptr (the residual's own storage, or a new tensor's)."""
    row = tl.program_id(0).to(tl.int64)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x_offsets = row * x_stride_row + cols * x_stride_col
        res_offsets = row * res_stride_row + cols * res_stride_col
        total = _load_total(x_ptr, x_offsets, res_ptr, res_offsets, mask)
        rstd = tl.rsqrt(tl.sum(total * total) / n_cols + eps)
        _store_rms(total, rstd, cols, mask, w_ptr, w_stride, out_ptr, row * out_stride_row + cols * out_stride_col,
                   sum_ptr, row * sum_stride_row + cols * sum_stride_col, UNIT_OFFSET)
    else:
        rstd = _chunked_rstd(x_ptr, res_ptr, row, x_stride_row, x_stride_col, res_stride_row, res_stride_col, n_cols,
                             eps, BLOCK)
        # The second pass recomputes the total from x and residual, and writes it only now: reading
        # back a total stored by the first pass could meet another thread's unsynchronised store.
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            total = _load_total(x_ptr, row * x_stride_row + cols * x_stride_col,
                                res_ptr, row * res_stride_row + cols * res_stride_col, mask)
            _store_rms(total, rstd, cols, mask, w_ptr, w_stride, out_ptr, row * out_stride_row + cols * out_stride_col,
                       sum_ptr, row * sum_stride_row + cols * sum_stride_col, UNIT_OFFSET)


@launcher
@triton.jit
def _rms_norm_fp8_kernel(x_ptr, res_ptr, w_ptr, q_ptr, scale_ptr, x_stride_row, x_stride_col, res_stride_row,
                         res_stride_col, w_stride, n_cols, eps, E4M3: tl.constexpr, BLOCK: tl.constexpr,
                         ONE_TILE: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """rms_norm of one row of x (or of x + residual), quantised to e4m3 with the row's scale
    amax / E4M3 as kernels/triton_ops/fp8.py quantises (IEEE division, clamped, nearest even).
    q is a contiguous (rows, n_cols). A row wider than BLOCK is walked three times (its sum of
    squares, its amax, then the store), recomputing the total each time, mostly from L2."""
    row = tl.program_id(0).to(tl.int64)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        res_offsets = row * res_stride_row + cols * res_stride_col
        total = _load_total(x_ptr, row * x_stride_row + cols * x_stride_col, res_ptr, res_offsets, mask)
        rstd = tl.rsqrt(tl.sum(total * total) / n_cols + eps)
        _store_total(total, mask, res_ptr, res_offsets)
        out = _normed(total, rstd, cols, mask, w_ptr, w_stride, x_ptr, UNIT_OFFSET)
        scale = row_scale(tl.abs(out), E4M3)
        tl.store(scale_ptr + row, scale)
        store_quantised(q_ptr + row * n_cols + cols, out, scale, mask, E4M3)
    else:
        rstd = _chunked_rstd(x_ptr, res_ptr, row, x_stride_row, x_stride_col, res_stride_row, res_stride_col, n_cols,
                             eps, BLOCK)
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            total = _load_total(x_ptr, row * x_stride_row + cols * x_stride_col,
                                res_ptr, row * res_stride_row + cols * res_stride_col, mask)
            amax = tl.maximum(amax, tl.abs(_normed(total, rstd, cols, mask, w_ptr, w_stride, x_ptr, UNIT_OFFSET)))
        scale = row_scale(amax, E4M3)
        tl.store(scale_ptr + row, scale)
        # the total is written in this last pass only, as _rms_norm_kernel does (see there)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            res_offsets = row * res_stride_row + cols * res_stride_col
            total = _load_total(x_ptr, row * x_stride_row + cols * x_stride_col, res_ptr, res_offsets, mask)
            _store_total(total, mask, res_ptr, res_offsets)
            out = _normed(total, rstd, cols, mask, w_ptr, w_stride, x_ptr, UNIT_OFFSET)
            store_quantised(q_ptr + row * n_cols + cols, out, scale, mask, E4M3)


@launcher
@triton.jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, x_stride_row, x_stride_col, w_stride, b_stride,
                       out_stride_row, n_cols, eps, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    """layer_norm of one row. The variance is the mean of squared deviations from the mean
    (two passes), not E[x^2] - mean^2, which cancels badly when the mean is large."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride_row
    out_row = out_ptr + row * out_stride_row
    if ONE_TILE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_stride_col, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x) / n_cols
        centred = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred) / n_cols + eps)
        weight = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
        bias = tl.load(b_ptr + cols * b_stride, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, (centred * rstd * weight + bias).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            total += tl.load(x_row + cols * x_stride_col, mask=cols < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(total) / n_cols
        sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols * x_stride_col, mask=mask, other=0.0).to(tl.float32)
            centred = tl.where(mask, x - mean, 0.0)
            sum_sq += centred * centred
        rstd = tl.rsqrt(tl.sum(sum_sq) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols * x_stride_col, mask=mask, other=0.0).to(tl.float32)
            weight = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
            bias = tl.load(b_ptr + cols * b_stride, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_row + cols, ((x - mean) * rstd * weight + bias).to(out_ptr.dtype.element_ty), mask=mask)


def _check_vectors(rows, *vectors) -> None:
    """Per-column vectors must span the row: the kernel would read past a shorter one."""
    for vector in vectors:
        if vector.shape != rows.shape[-1:]:
            raise ValueError(f"rows of {rows.shape[-1]} need vectors of that length, got {tuple(vector.shape)}")


def _rms_rows(rows, residual_rows, weight, out, eps: float, unit_offset: bool, block: int, warps: int,
              total=None) -> None:
    """The normed rows into out; with a residual, their total into `total` (default: in place, into
    the residual's storage)."""
    _check_vectors(rows, weight)
    n_rows, n_cols = rows.shape
    if n_rows == 0:
        return
    res_strides = residual_rows.stride() if residual_rows is not None else (0, 0)
    total = residual_rows if total is None else total
    sum_strides = total.stride() if total is not None else (0, 0)
    _rms_norm_kernel[(n_rows,)](rows, residual_rows, weight, out, total, *rows.stride(), *res_strides,
                                weight.stride(0), *out.stride(), *sum_strides, n_cols, eps, **row_tiling(n_cols, block),
                                UNIT_OFFSET=unit_offset, num_warps=warps)


def rms_norm(x, weight, eps: float, unit_offset: bool = False, *, block: int, warps: int):
    """Over the last dim; also norm.qk's per-head norm, x (..., heads, d) with weight (d,)."""
    rows = as_rows(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    _rms_rows(rows, None, weight, out, eps, unit_offset, block, warps)
    return out.view(x.shape)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False, *,
                 block: int, warps: int):
    """In place, as serving engines do (the op's contract allows it): the total goes into
    residual's storage and the normed rows into x's; returns (normed, total). keep_inputs: both
    into new tensors, x and residual left as they were (the same reads and writes)."""
    if residual.shape != x.shape:
        raise ValueError(f"rms_norm_add: residual {tuple(residual.shape)} is not the shape of x {tuple(x.shape)}")
    rows, residual_rows = as_rows(x), as_rows(residual)
    if keep_inputs:
        normed, total = torch.empty(rows.shape, dtype=x.dtype, device=x.device), torch.empty_like(residual_rows)
        _rms_rows(rows, residual_rows, weight, normed, eps, unit_offset, block, warps, total)
        return normed.view(x.shape), total.view(residual.shape)
    _rms_rows(rows, residual_rows, weight, rows, eps, unit_offset, block, warps)
    # Views of x and residual (copies only where as_rows had to copy leading dims).
    return rows.view(x.shape), residual_rows.view(residual.shape)


def _rms_fp8_rows(rows, residual_rows, weight, eps: float, unit_offset: bool, block: int, warps: int):
    """(q (rows, n) e4m3, scale (rows, 1) fp32) of the normed rows; the total into residual_rows."""
    _check_vectors(rows, weight)
    n_rows, n_cols = rows.shape
    q = torch.empty(rows.shape, dtype=torch.float8_e4m3fn, device=rows.device)
    scale = torch.empty((n_rows, 1), dtype=torch.float32, device=rows.device)
    if n_rows:
        res_strides = residual_rows.stride() if residual_rows is not None else (0, 0)
        _rms_norm_fp8_kernel[(n_rows,)](rows, residual_rows, weight, q, scale, *rows.stride(), *res_strides,
                                        weight.stride(0), n_cols, eps, E4M3=E4M3_MAX, **row_tiling(n_cols, block),
                                        UNIT_OFFSET=unit_offset, num_warps=warps)
    return q, scale


def rms_norm_fp8(x, weight, eps: float, unit_offset: bool = False, *, block: int, warps: int):
    """norm.rms_fp8 in one pass: (q shaped like x, scale (..., 1))."""
    q, scale = _rms_fp8_rows(as_rows(x), None, weight, eps, unit_offset, block, warps)
    return q.view(x.shape), scale.view(*x.shape[:-1], 1)


def rms_norm_add_fp8(x, residual, weight, eps: float, unit_offset: bool = False, *, block: int, warps: int):
    """norm.rms_add_fp8 in one pass; the total goes into residual's storage: (q, scale, total)."""
    if residual.shape != x.shape:
        raise ValueError(f"rms_norm_add_fp8: residual {tuple(residual.shape)} is not the shape of x {tuple(x.shape)}")
    residual_rows = as_rows(residual)
    q, scale = _rms_fp8_rows(as_rows(x), residual_rows, weight, eps, unit_offset, block, warps)
    return q.view(x.shape), scale.view(*x.shape[:-1], 1), residual_rows.view(residual.shape)


def layer_norm(x, weight, bias, eps: float, *, block: int, warps: int):
    rows = as_rows(x)
    _check_vectors(rows, weight, bias)
    n_rows, n_cols = rows.shape
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if n_rows:
        _layer_norm_kernel[(n_rows,)](rows, weight, bias, out, *rows.stride(), weight.stride(0), bias.stride(0),
                                      out.stride(0), n_cols, eps, **row_tiling(n_cols, block),
                                      num_warps=warps)
    return out.view(x.shape)
