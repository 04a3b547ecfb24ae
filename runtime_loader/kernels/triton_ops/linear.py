"""linear: x @ weight.T (+ bias), a tiled GEMM with fp32 accumulation and an optional split-K.

Split-K (SPLIT_K > 1) gives each of SPLIT_K programs a share of K for the same output tile,
which keeps the GPU busy when M is small (decode) and there are few output tiles. The
partial sums go to an fp32 (SPLIT_K, M, N) buffer that a second kernel adds in split
order (plus the bias) and casts: no atomics, so every run gives the same bits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launcher
from .layout import as_rows

GROUP_M = 8  # output tiles are walked in bands of 8 row-blocks, so neighbouring programs share weight tiles in L2
REDUCE_BLOCK = 1024


@triton.jit
def output_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of program pid, walked in bands of GROUP_M row blocks."""
    m_tiles = tl.cdiv(M, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * n_tiles
    first_m = (pid // tiles_per_group) * GROUP_M
    group_m = tl.minimum(m_tiles - first_m, GROUP_M)
    return first_m + (pid % tiles_per_group) % group_m, (pid % tiles_per_group) // group_m


@triton.jit
def split_share(split, K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[begin, end) of K for this split: whole BLOCK_K blocks, the last splits possibly empty."""
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_begin = split * k_per_split
    return k_begin, tl.minimum(k_begin + k_per_split, K)


# M is the token count: not specialised on, so one compile serves every token count (a CUDA
# graph captured at a new batch size must not meet a first compile).
@launcher
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, x_stride_m, x_stride_k, w_stride_n, w_stride_k,
                   bias_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """out[split] = x @ weight.T over this split's share of K, plus the bias when bias_ptr is
    given. out is a contiguous (SPLIT_K, M, N); with SPLIT_K == 1 it is the result itself."""
    pid_m, pid_n = output_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    split = tl.program_id(1)

    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrapped into range: rows and columns past the edge re-read valid data and are never
    # stored, so the loads need a mask on K only.
    x_rows = x_ptr + (out_rows % M).to(tl.int64)[:, None] * x_stride_m
    w_cols = w_ptr + (out_cols % N).to(tl.int64)[None, :] * w_stride_n

    k_begin, k_end = split_share(split, K, BLOCK_K, SPLIT_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(x_rows + ks[None, :] * x_stride_k, mask=ks[None, :] < K, other=0.0)
        b = tl.load(w_cols + ks[:, None] * w_stride_k, mask=ks[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    if bias_ptr is not None:
        acc += tl.load(bias_ptr + (out_cols % N) * bias_stride).to(tl.float32)[None, :]
    out = out_ptr + split.to(tl.int64) * M * N + out_rows.to(tl.int64)[:, None] * N + out_cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


@launcher
@triton.jit(do_not_specialize=["n_elements"])
def _sum_splits_kernel(partials_ptr, bias_ptr, out_ptr, n_elements, N, bias_stride,
                       SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out = the SPLIT_K partial (M, N) products summed in split order, plus the bias."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    partials = partials_ptr + offsets
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in tl.static_range(SPLIT_K):
        acc += tl.load(partials, mask=mask, other=0.0)
        partials += n_elements
    if bias_ptr is not None:
        acc += tl.load(bias_ptr + (offsets % N) * bias_stride, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


def linear(x, weight, bias=None, *, block_m: int, block_n: int, block_k: int, warps: int, stages: int,
           split_k: int):
    rows = as_rows(x)
    m, k = rows.shape
    n = weight.shape[0]
    if weight.shape != (n, k) or (bias is not None and bias.shape != (n,)):  # the kernel would read past them
        raise ValueError(f"linear: x (..., {k}) needs weight ({n}, {k}) and bias ({n},); got weight "
                         f"{tuple(weight.shape)}, bias {None if bias is None else tuple(bias.shape)}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if out.numel():
        bias_stride = bias.stride(0) if bias is not None else 0
        # fp32 inputs: three TF32 products per multiply (tf32x3) keep fp32 accuracy on tensor cores,
        # where plain TF32 would miss the fp32 tolerance; half types ignore the setting.
        precision = "tf32x3" if x.dtype == torch.float32 else "tf32"
        target = out if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k)
        _matmul_kernel[grid](rows, weight, bias if split_k == 1 else None, target, m, n, k, *rows.stride(),
                             *weight.stride(), bias_stride, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                             GROUP_M=GROUP_M, SPLIT_K=split_k, DOT_PRECISION=precision,
                             num_warps=warps, num_stages=stages)
        if split_k > 1:
            _sum_splits_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](target, bias, out, m * n, n, bias_stride,
                                                                   SPLIT_K=split_k, BLOCK=REDUCE_BLOCK)
    return out.view(*x.shape[:-1], n)
