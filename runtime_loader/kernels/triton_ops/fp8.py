"""linear.fp8 (W8A8): x quantised per token to float8 e4m3 in one Triton pass, then an FP8 GEMM
with both scales applied to the fp32 accumulator: cuBLASLt's (torch._scaled_mm) or our own;
linear.fp8_prequantised: our GEMM alone, x quantised beforehand (by norm.rms_fp8).

Our GEMM comes in two forms. `_fp8_matmul_kernel` loads tiles through pointers, a program per
output tile (and per split of K). `_fp8_matmul_tma_kernel` is Hopper's: a persistent grid (a
program per SM walking the output tiles) loading both operands by TMA through tensor
descriptors. On an H200 the TMA form ran 1.69-1.94x bf16 cuBLAS from 1024 tokens on gate/up and
down_proj, where cuBLASLt's row-wise FP8 GEMM ran 1.63-1.94x and the pointer form 1.60-1.86x
(benchmarks/fp8_tma_probe.py).

The eager quantisation (runtime_loader.quant.quantize_per_token) is about seven launches with fp32
temporaries of the whole activation; it cost more than the FP8 GEMM saved, so FP8 linears ran
0.2-0.9x bf16 on the H100 (benchmarks/fp8.py). Here it is one read of x and one write of a byte per
element. The rounding is the format's, as the reference does it: scale = amax times the fp32 reciprocal of
448 per row (amax at least 1e-12), x / scale with IEEE division, clamped, rounded to nearest even.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...quant import E4M3_MAX
from .launch import launcher
from .layout import as_rows
from .linear import REDUCE_BLOCK, _sum_splits_kernel, output_tile, split_share

GROUP_M = 8  # output tiles walked in bands of 8 row-blocks, as kernels/triton_ops/linear.py
QUANT_BLOCK_MAX = 8192  # a row up to this wide is read once for its amax and once to quantise, from L2


@triton.jit
def row_scale(amax, E4M3: tl.constexpr):
    """A row's e4m3 scale from its amax (a scalar, or a block whose max is taken): amax times the
    fp32 reciprocal of E4M3, as quant.quantize_per_token computes it; amax at least 1e-12."""
    return tl.maximum(tl.max(amax, 0), 1e-12) * (1.0 / E4M3)


@triton.jit
def store_quantised(q_ptrs, values, scale, mask, E4M3: tl.constexpr):
    """values / scale in e4m3 as the reference quantises: IEEE division, clamped, nearest even."""
    q = tl.clamp(tl.math.div_rn(values, scale), -E4M3, E4M3)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)


@launcher
@triton.jit(do_not_specialize=["rows"])
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, rows, K, x_stride, E4M3: tl.constexpr, BLOCK: tl.constexpr):
    """q[row] = x[row] / scale[row] in e4m3, scale[row] = amax(|x[row]|) / E4M3; a program per row."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(0, K, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)))
    scale = row_scale(amax, E4M3)
    tl.store(scale_ptr + row, scale)
    for k in range(0, K, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
        store_quantised(q_ptr + row * K + cols, x, scale, cols < K, E4M3)


def quantize_per_token(rows: torch.Tensor, warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (m, k) e4m3 contiguous, scale (m, 1) fp32) of a 2-D x read through its row stride."""
    m, k = rows.shape
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=rows.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=rows.device)
    if m and k:
        block = min(triton.next_power_of_2(k), QUANT_BLOCK_MAX)
        _quantize_rows_kernel[(m,)](rows, q, scale, m, k, rows.stride(0), E4M3=E4M3_MAX, BLOCK=block, num_warps=warps)
    return q, scale


def _checked(x, weight, weight_scale, bias):
    rows = as_rows(x)
    n, k = weight.shape
    if rows.shape[1] != k or weight_scale.numel() not in (1, n) or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"linear.fp8: x (..., {rows.shape[1]}) needs weight (n, {rows.shape[1]}), weight_scale (n,) "
                         f"or (1,), bias (n,); got weight {tuple(weight.shape)}, weight_scale "
                         f"{tuple(weight_scale.shape)}, bias {None if bias is None else tuple(bias.shape)}")
    return rows, n


def scaled_mm_fp8(x, weight, weight_scale, bias=None, *, warps: int):
    """The Triton quantisation, then cuBLASLt's FP8 GEMM with row-wise scales."""
    rows, n = _checked(x, weight, weight_scale, bias)
    q, scale = quantize_per_token(rows, warps)
    scale_b = weight_scale.float().expand(n).reshape(1, n).contiguous()
    out = torch._scaled_mm(q, weight.t(), scale_a=scale, scale_b=scale_b, bias=bias, out_dtype=x.dtype)
    return out.reshape(*x.shape[:-1], n)


# M is the token count: not specialised on, so one compile serves every token count.
@launcher
@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_kernel(q_ptr, w_ptr, x_scale_ptr, w_scale_ptr, bias_ptr, out_ptr, M, N, K, w_stride_n,
                       w_scale_stride, bias_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr):
    """out[split] = (q @ w.T) * x_scale[m] * w_scale[n] (+ bias) over this split's share of K, q
    (M, K) and w (N, K) in e4m3, fp32 accumulation; w_scale_stride 0 for one scale of the whole
    weight. out is a contiguous (SPLIT_K, M, N); with SPLIT_K == 1 it is the result itself. The
    scales apply to each split's partial sum (they are linear), as kernels/triton_ops/linear.py
    splits K: a decode-sized M over few output tiles (q/k/v: 1280 columns) needs the programs."""
    pid_m, pid_n = output_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    split = tl.program_id(1)

    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # rows and columns past the edge re-read valid data and are never stored: masks on K only
    q_rows = q_ptr + (out_rows % M).to(tl.int64)[:, None] * K
    w_cols = w_ptr + (out_cols % N).to(tl.int64)[None, :] * w_stride_n
    k_begin, k_end = split_share(split, K, BLOCK_K, SPLIT_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(q_rows + ks[None, :], mask=ks[None, :] < K, other=0.0)
        b = tl.load(w_cols + ks[:, None], mask=ks[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc)

    acc *= tl.load(x_scale_ptr + out_rows % M)[:, None]
    acc *= tl.load(w_scale_ptr + (out_cols % N) * w_scale_stride)[None, :]
    if bias_ptr is not None:
        acc += tl.load(bias_ptr + (out_cols % N) * bias_stride).to(tl.float32)[None, :]
    out = out_ptr + split.to(tl.int64) * M * N + out_rows.to(tl.int64)[:, None] * N + out_cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def quantised_input(x, weight, weight_scale, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) of x, checked against the weight, for our GEMMs: the Triton quantisation."""
    rows, _ = _checked(x, weight, weight_scale, bias)
    return quantize_per_token(rows, 4 if rows.shape[1] <= 4096 else 8)  # a warp per 1024 of the row, 8 at most


def contiguous_rows(q) -> torch.Tensor:
    """A quantised input's rows as our GEMMs read them: (m, k), each row contiguous and next to the last."""
    rows = as_rows(q)
    return rows if rows.stride(1) == 1 and rows.stride(0) == rows.shape[1] else rows.contiguous()


def linear_fp8(x, weight, weight_scale, bias=None, *, block_m: int, block_n: int, block_k: int, warps: int,
               stages: int, split_k: int):
    """The Triton quantisation, then our FP8 GEMM: two launches (three with split_k > 1)."""
    q, scale = quantised_input(x, weight, weight_scale, bias)
    out = fp8_matmul(q, scale, weight, weight_scale, bias, x.dtype, block_m=block_m, block_n=block_n,
                     block_k=block_k, warps=warps, stages=stages, split_k=split_k)
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_fp8_prequantised(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16, *, block_m: int,
                            block_n: int, block_k: int, warps: int, stages: int, split_k: int):
    """Our FP8 GEMM alone, on an input quantised beforehand (norm.rms_fp8's q and scales)."""
    out = fp8_matmul(contiguous_rows(q), x_scale.reshape(-1, 1).float(), weight, weight_scale, bias, out_dtype,
                     block_m=block_m, block_n=block_n, block_k=block_k, warps=warps, stages=stages, split_k=split_k)
    return out.view(*q.shape[:-1], weight.shape[0])


def fp8_matmul(q, x_scale, weight, weight_scale, bias, out_dtype, *, block_m: int, block_n: int, block_k: int,
               warps: int, stages: int, split_k: int):
    """(q @ weight.T) * x_scale * weight_scale (+ bias) in out_dtype: q (m, k) e4m3 contiguous,
    x_scale (m, 1) fp32, weight (n, k) e4m3, weight_scale (n,) or (1,)."""
    (m, k), n = q.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if out.numel():
        if weight.stride(1) != 1:
            weight = weight.contiguous()
        scales = weight_scale.reshape(-1).float()
        bias_stride = bias.stride(0) if bias is not None else 0
        target = out if split_k == 1 else torch.empty((split_k, m, n), dtype=torch.float32, device=q.device)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split_k)
        _fp8_matmul_kernel[grid](q, weight, x_scale, scales, bias if split_k == 1 else None, target, m, n, k,
                                 weight.stride(0), 1 if scales.numel() > 1 else 0, bias_stride, BLOCK_M=block_m,
                                 BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M, SPLIT_K=split_k,
                                 num_warps=warps, num_stages=stages)
        if split_k > 1:
            _sum_splits_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](target, bias, out, m * n, n, bias_stride,
                                                                   SPLIT_K=split_k, BLOCK=REDUCE_BLOCK)
    return out


@functools.cache
def programs_per_device(device: torch.device) -> int:
    """A persistent grid's size: one program per SM; two in the interpreter (CPU), so that its
    programs still walk several tiles each."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


# M is the token count: not specialised on, so one compile serves every token count. Launched
# through Triton's JIT function, not `launcher`'s fast path, whose key does not cover tensor
# descriptors (how Triton specialises on them is not replayed there).
@triton.jit(do_not_specialize=["M"])
def _fp8_matmul_tma_kernel(q_desc, w_desc, out_desc, x_scale_ptr, w_scale_ptr, bias_ptr, M, N, K, w_scale_stride,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           PROGRAMS: tl.constexpr):
    """out = (q @ w.T) * x_scale[m] * w_scale[n] (+ bias), as _fp8_matmul_kernel without split K:
    q (M, K) and w (N, K) in e4m3 through TMA descriptors, which read zeros past the edges (no
    masks on the loads) and store only the tile's part inside out. PROGRAMS programs walk the
    output tiles. The epilogue's tile is recomputed from a counter of its own, as Triton's
    persistent-matmul tutorial does, so that the pipeliner can overlap the next tile's loads
    with this tile's epilogue (flatten)."""
    start = tl.program_id(0)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_out = start - PROGRAMS
    for tile in tl.range(start, tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = output_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = q_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        tile_out += PROGRAMS
        pid_m, pid_n = output_tile(tile_out, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc *= tl.load(x_scale_ptr + rows, mask=rows < M, other=0.0)[:, None]
        acc *= tl.load(w_scale_ptr + cols * w_scale_stride, mask=cols < N, other=0.0)[None, :]
        if bias_ptr is not None:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(out_desc.dtype))


def fp8_matmul_tma(q, x_scale, weight, weight_scale, bias, out_dtype, *, block_m: int, block_n: int, block_k: int,
                   warps: int, stages: int):
    """fp8_matmul's result through the TMA kernel: q (m, k) e4m3 contiguous, x_scale (m, 1) fp32,
    weight (n, k) e4m3, weight_scale (n,) or (1,). TMA reads rows whose byte stride is a multiple
    of 16: k % 16 == 0, and n % 8 == 0 for a 2-byte out."""
    from triton.tools.tensor_descriptor import TensorDescriptor  # Triton 3.4+: the other kernels run without it

    (m, k), n = q.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if k % 16 or (n * out.element_size()) % 16:
        raise ValueError(f"TMA needs rows of 16-byte multiples: k % 16 == 0 and n * {out.element_size()} % 16 == 0; "
                         f"got k={k}, n={n}")
    if out.numel():
        weight = weight.contiguous()
        scales = weight_scale.reshape(-1).float()
        if bias is not None:
            bias = bias.contiguous()
        programs = min(programs_per_device(q.device), triton.cdiv(m, block_m) * triton.cdiv(n, block_n))
        _fp8_matmul_tma_kernel[(programs,)](
            TensorDescriptor.from_tensor(q, [block_m, block_k]), TensorDescriptor.from_tensor(weight, [block_n, block_k]),
            TensorDescriptor.from_tensor(out, [block_m, block_n]), x_scale, scales, bias, m, n, k,
            1 if scales.numel() > 1 else 0, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M,
            PROGRAMS=programs, num_warps=warps, num_stages=stages)
    return out


def linear_fp8_tma(x, weight, weight_scale, bias=None, *, block_m: int, block_n: int, block_k: int, warps: int,
                   stages: int):
    """The Triton quantisation, then the TMA GEMM: two launches."""
    q, scale = quantised_input(x, weight, weight_scale, bias)
    out = fp8_matmul_tma(q, scale, weight, weight_scale, bias, x.dtype, block_m=block_m, block_n=block_n,
                         block_k=block_k, warps=warps, stages=stages)
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_fp8_prequantised_tma(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16, *,
                                block_m: int, block_n: int, block_k: int, warps: int, stages: int):
    """The TMA GEMM alone, on an input quantised beforehand (norm.rms_fp8's q and scales)."""
    out = fp8_matmul_tma(contiguous_rows(q), x_scale.reshape(-1, 1).float(), weight, weight_scale, bias, out_dtype,
                         block_m=block_m, block_n=block_n, block_k=block_k, warps=warps, stages=stages)
    return out.view(*q.shape[:-1], weight.shape[0])
