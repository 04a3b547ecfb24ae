"""Rotary position embedding of q and k in one launch, out of place.

A program takes one token of one sequence and BLOCK_H heads of q or of k: it loads the
token's angles once and rotates every pair of those heads with them. cos and sin are
laid out as Hugging Face builds them (batch or 1, seq, head_dim), one angle per pair
stored at the pair's first element: split-half pairs (i, i + d/2), interleaved pairs
(2i, 2i + 1).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launcher


@triton.jit
def _rotate_heads(src_ptr, src_stride_head, src_stride_dim, dst_ptr, dst_stride_head, dst_stride_dim,
                  first_head, n_heads, cos, sin, first, second, pair_mask, BLOCK_H: tl.constexpr):
    """Each pair (a, b) of heads first_head.. of one token -> (a cos - b sin, b cos + a sin)."""
    heads = first_head + tl.arange(0, BLOCK_H)
    mask = (heads < n_heads)[:, None] & pair_mask[None, :]
    src = src_ptr + heads[:, None] * src_stride_head
    a = tl.load(src + first[None, :] * src_stride_dim, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + second[None, :] * src_stride_dim, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + heads[:, None] * dst_stride_head
    out_dtype = dst_ptr.dtype.element_ty
    tl.store(dst + first[None, :] * dst_stride_dim, (a * cos - b * sin).to(out_dtype), mask=mask)
    tl.store(dst + second[None, :] * dst_stride_dim, (b * cos + a * sin).to(out_dtype), mask=mask)


@launcher
@triton.jit
def _rope_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr,
                 q_stride_batch, q_stride_head, q_stride_seq, q_stride_dim,
                 k_stride_batch, k_stride_head, k_stride_seq, k_stride_dim,
                 q_out_stride_batch, q_out_stride_head, q_out_stride_seq, q_out_stride_dim,
                 k_out_stride_batch, k_out_stride_head, k_out_stride_seq, k_out_stride_dim,
                 cos_stride_batch, cos_stride_seq, cos_stride_dim,
                 sin_stride_batch, sin_stride_seq, sin_stride_dim,
                 n_q_heads, n_k_heads,
                 HALF_DIM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, INTERLEAVED: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    batch = tl.program_id(1).to(tl.int64)
    head_block = tl.program_id(2)
    pairs = tl.arange(0, BLOCK_P)
    pair_mask = pairs < HALF_DIM
    if INTERLEAVED:
        first = 2 * pairs
        second = first + 1
    else:
        first = pairs
        second = pairs + HALF_DIM
    cos = tl.load(cos_ptr + batch * cos_stride_batch + token * cos_stride_seq + first * cos_stride_dim,
                  mask=pair_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + batch * sin_stride_batch + token * sin_stride_seq + first * sin_stride_dim,
                  mask=pair_mask, other=0.0).to(tl.float32)
    q_blocks = tl.cdiv(n_q_heads, BLOCK_H)
    if head_block < q_blocks:
        _rotate_heads(q_ptr + batch * q_stride_batch + token * q_stride_seq, q_stride_head, q_stride_dim,
                      q_out_ptr + batch * q_out_stride_batch + token * q_out_stride_seq, q_out_stride_head,
                      q_out_stride_dim, head_block * BLOCK_H, n_q_heads, cos, sin, first, second, pair_mask, BLOCK_H)
    else:
        _rotate_heads(k_ptr + batch * k_stride_batch + token * k_stride_seq, k_stride_head, k_stride_dim,
                      k_out_ptr + batch * k_out_stride_batch + token * k_out_stride_seq, k_out_stride_head,
                      k_out_stride_dim, (head_block - q_blocks) * BLOCK_H, n_k_heads, cos, sin, first, second,
                      pair_mask, BLOCK_H)


def rope(q, k, cos, sin, interleaved: bool, *, block_h: int, warps: int):
    """q: (batch, hq, seq, d), k: (batch, hkv, seq, d), cos/sin: (batch or 1, seq, d)."""
    batch, n_q_heads, seq, head_dim = q.shape
    n_k_heads = k.shape[1]
    if k.shape != (batch, n_k_heads, seq, head_dim):
        raise ValueError(f"rope: k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, seq and head_dim")
    # Same memory layout as the inputs (e.g. Hugging Face's (batch, seq, heads, d) transposed).
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if batch * seq == 0:
        return q_out, k_out
    cos, sin = cos.expand(batch, seq, head_dim), sin.expand(batch, seq, head_dim)  # batch of 1: stride 0
    head_blocks = triton.cdiv(n_q_heads, block_h) + triton.cdiv(n_k_heads, block_h)
    _rope_kernel[(seq, batch, head_blocks)](
        q, k, q_out, k_out, cos, sin, *q.stride(), *k.stride(), *q_out.stride(), *k_out.stride(),
        *cos.stride(), *sin.stride(), n_q_heads, n_k_heads,
        HALF_DIM=head_dim // 2, BLOCK_P=triton.next_power_of_2(head_dim // 2), BLOCK_H=block_h,
        INTERLEAVED=bool(interleaved), num_warps=warps)
    return q_out, k_out
