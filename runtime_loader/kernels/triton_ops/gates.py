"""Qwen3.5's Gated DeltaNet gates in one launch: g = -exp(A_log) * softplus(a + dt_bias) in fp32
and beta = sigmoid(b), over (block_t tokens, every head) tiles.

a and b are read through their row strides: they arrive as columns of one projection output
(in_proj_a and in_proj_b run as one GEMM), which the model's six elementwise launches also read.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launcher
from .layout import as_rows


@launcher
@triton.jit
def _gates_kernel(a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, a_stride, b_stride, n_rows, heads,
                  BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    in_row = cols < heads
    mask = (rows[:, None] < n_rows) & in_row[None, :]
    a = tl.load(a_ptr + rows[:, None] * a_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * b_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    decay_rate = tl.exp(tl.load(a_log_ptr + cols, mask=in_row, other=0.0).to(tl.float32))
    x = a + tl.load(dt_bias_ptr + cols, mask=in_row, other=0.0).to(tl.float32)[None, :]
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold of 20
    out = rows[:, None] * heads + cols[None, :]
    tl.store(g_ptr + out, -decay_rate[None, :] * softplus, mask=mask)
    tl.store(beta_ptr + out, tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=mask)


def deltanet_gates(a, b, a_log, dt_bias, *, block_t: int, warps: int):
    if a.shape != b.shape:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} differ in shape")
    a_rows, b_rows = as_rows(a), as_rows(b)
    n_rows, heads = a_rows.shape
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    if n_rows and a_rows.stride(1) == 1 and b_rows.stride(1) == 1:
        _gates_kernel[(triton.cdiv(n_rows, block_t),)](
            a_rows, b_rows, a_log, dt_bias, g, beta, a_rows.stride(0), b_rows.stride(0), n_rows, heads,
            BLOCK_T=block_t, BLOCK_H=triton.next_power_of_2(heads), num_warps=warps)
    elif n_rows:
        raise ValueError("a and b must have unit stride along the heads")
    return g, beta
