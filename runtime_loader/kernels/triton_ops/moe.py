"""moe.experts: a fused mixture-of-experts MLP in two launches (the scheme of vLLM's fused_moe).

The (token, slot) pairs are sorted by expert into segments padded to BLOCK_M rows, so every
row block of the GEMMs belongs to one expert. The first launch is the gate_up GEMM with the
gate and up rows of each intermediate column interleaved in its weight tile, so one
accumulator holds both and the epilogue adds the biases and writes the gated activation
(silu(gate) * up, or GPT-OSS's clamped form); the second multiplies that by the expert's down
weights and by each pair's routing weight. BLOCK_N counts weight rows in both (as vLLM's
BLOCK_SIZE_N does: its configurations mean the same tiles here). Weights are read through their
strides, so views of weights stored (experts, in, out) need no copy. A token's slots are then
summed in token order. The sorting is three small
launches (align_blocks) whose sizes depend on the token count alone (padded for the worst case:
every expert's segment one row short of a block), so nothing waits on the host and the call can
be captured in a CUDA graph; row blocks past the used ones exit at once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launcher


def align_blocks(topk_ids, experts: int, block_m: int):
    """(rows, block_expert): rows holds, for each expert's segment padded to a multiple of
    block_m, the indices of its (token, slot) pairs in topk_ids.flatten() (the padding holds
    the sentinel topk_ids.numel()); block_expert the expert of each block of rows (-1 unused).
    Pairs of other ranks' experts (ids >= experts) land in no segment. Three launches (count,
    segments, place) instead of two dozen torch ops: in eager mode each op is host time
    (benchmarks/moe_layer.py). Within a segment the pairs' order is the atomics' (each row of the
    GEMMs depends on its own pair alone, so the results do not)."""
    ids = topk_ids.reshape(-1)
    pairs = ids.numel()
    capacity = triton.cdiv(pairs + experts * (block_m - 1), block_m)  # blocks, for the worst case
    rows = torch.full((capacity * block_m,), pairs, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty((capacity,), dtype=torch.int32, device=ids.device)
    counts = torch.zeros((2, experts), dtype=torch.int32, device=ids.device)  # counts, then each segment's cursor
    grid = (triton.cdiv(pairs, ALIGN_BLOCK),)
    _count_kernel[grid](ids, counts, pairs, experts, BLOCK=ALIGN_BLOCK)
    _segments_kernel[(1,)](counts, block_expert, capacity, experts, block_m,
                           BLOCK_E=triton.next_power_of_2(experts), BLOCK_B=64)
    _place_kernel[grid](ids, counts[1], rows, pairs, experts, BLOCK=ALIGN_BLOCK)
    return rows, block_expert


ALIGN_BLOCK = 1024  # pairs per program of the count and place kernels


@launcher
@triton.jit(do_not_specialize=["pairs"])
def _count_kernel(ids_ptr, counts_ptr, pairs, experts, BLOCK: tl.constexpr):
    """counts[e] += the pairs of expert e among this program's BLOCK pairs."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + offs, mask=offs < pairs, other=experts)
    tl.atomic_add(counts_ptr + ids, 1, mask=ids < experts)


@launcher
@triton.jit
def _segments_kernel(counts_ptr, block_expert_ptr, blocks, experts, block_m, BLOCK_E: tl.constexpr,
                     BLOCK_B: tl.constexpr):
    """From the counts (row 0 of counts_ptr): each segment's first row (row 1, the place kernel's
    cursors), and the expert of each block: how many segments end at or before its first row."""
    e = tl.arange(0, BLOCK_E)
    counts = tl.load(counts_ptr + e, mask=e < experts, other=0)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = tl.cumsum(padded, axis=0)
    tl.store(counts_ptr + experts + e, ends - padded, mask=e < experts)
    for first in range(0, blocks, BLOCK_B):
        b = first + tl.arange(0, BLOCK_B)
        ended = (ends[None, :] <= (b * block_m)[:, None]) & (e[None, :] < experts)
        expert = tl.sum(ended.to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(expert < experts, expert, -1), mask=b < blocks)


@launcher
@triton.jit(do_not_specialize=["pairs"])
def _place_kernel(ids_ptr, cursor_ptr, rows_ptr, pairs, experts, BLOCK: tl.constexpr):
    """Each pair takes the next row of its expert's segment."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + offs, mask=offs < pairs, other=experts)
    local = ids < experts
    row = tl.atomic_add(cursor_ptr + ids, 1, mask=local)
    tl.store(rows_ptr + row, offs.to(tl.int32), mask=local)


@triton.jit
def _tile(pid, blocks, n_blocks, GROUP_M: tl.constexpr):
    """(row block, column block) of program `pid`: GROUP_M row blocks walked together per column
    block, so programs running side by side read the same expert weight tile (from L2)."""
    per_group = GROUP_M * n_blocks
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(blocks - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@launcher
@triton.jit(do_not_specialize=["pairs", "blocks"])
def _gate_up_kernel(x_ptr, w_ptr, bias_ptr, rows_ptr, block_expert_ptr, h_ptr, pairs, blocks, hidden, inter, top_k,
                    x_stride, w_stride_e, w_stride_n, w_stride_k, bias_stride_e, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr,
                    ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    """h[pair, n] = act(gate, up) with gate = x[token] . gate_up[e, gate row of n] (+ its bias) and up
    likewise, for the pairs of one row block (all of expert e) and BLOCK_N // 2 of the n: one GEMM
    tile of BLOCK_N weight rows, the gate and the up row of each n side by side, split in the
    epilogue. The gate row of n is n (the up row inter + n), or 2n (2n + 1) with INTERLEAVED."""
    block, column_block = _tile(tl.program_id(0), blocks, tl.cdiv(2 * inter, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    pair = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < pairs
    token = tl.where(valid, pair // top_k, 0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_N)
    n = column_block * (BLOCK_N // 2) + lanes // 2  # the intermediate column of each lane
    # even lanes: the gate row of n, odd lanes: its up row; past inter, wrapped: never stored
    weight_rows = 2 * (n % inter) + lanes % 2 if INTERLEAVED else (lanes % 2) * inter + n % inter
    w = w_ptr + expert.to(tl.int64) * w_stride_e + weight_rows[None, :].to(tl.int64) * w_stride_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, hidden, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + token[:, None] * x_stride + ks[None, :], mask=valid[:, None] & (ks[None, :] < hidden),
                    other=0.0)
        b = tl.load(w + ks[:, None] * w_stride_k, mask=ks[:, None] < hidden, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert.to(tl.int64) * bias_stride_e + weight_rows).to(tl.float32)[None, :]
    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
    if LIMIT > 0:  # GPT-OSS's clamped SwiGLU
        gate = tl.minimum(gate, LIMIT)
        act = gate * tl.sigmoid(ALPHA * gate) * (tl.clamp(up, -LIMIT, LIMIT) + 1)
    else:
        act = gate * tl.sigmoid(gate) * up
    cols = column_block * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    out = h_ptr + pair.to(tl.int64)[:, None] * inter + cols[None, :]
    tl.store(out, act.to(h_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < inter))


@launcher
@triton.jit(do_not_specialize=["pairs", "blocks"])
def _down_kernel(h_ptr, w_ptr, bias_ptr, rows_ptr, block_expert_ptr, weights_ptr, out_ptr, pairs, blocks, hidden,
                 inter, w_stride_e, w_stride_n, w_stride_k, bias_stride_e, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, HAS_BIAS: tl.constexpr):
    """out[pair, n] = weight[pair] * (h[pair] . down[e, n] (+ bias[e, n])) for one row block and a block of n."""
    block, column_block = _tile(tl.program_id(0), blocks, tl.cdiv(hidden, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    pair = tl.load(rows_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < pairs
    row = tl.where(valid, pair, 0).to(tl.int64)
    cols = column_block * BLOCK_N + tl.arange(0, BLOCK_N)
    w_cols = w_ptr + expert.to(tl.int64) * w_stride_e + (cols % hidden)[None, :].to(tl.int64) * w_stride_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, inter, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(h_ptr + row[:, None] * inter + ks[None, :], mask=valid[:, None] & (ks[None, :] < inter),
                    other=0.0)
        b = tl.load(w_cols + ks[:, None] * w_stride_k, mask=ks[:, None] < inter, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert.to(tl.int64) * bias_stride_e + cols % hidden).to(tl.float32)[None, :]
    acc *= tl.load(weights_ptr + row, mask=valid, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + row[:, None] * hidden + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (cols[None, :] < hidden))


def moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                alpha=0.0, limit=0.0, ep=1, *, block_m: int, block_n: int, block_k: int, group_m: int, warps: int,
                stages: int):
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    experts, inter = gate_up.shape[0], down.shape[2]
    biased = gate_up_bias is not None
    if gate_up.shape != (experts, 2 * inter, hidden) or down.shape != (experts, hidden, inter) or \
            topk_weights.shape != topk_ids.shape or x.stride(1) != 1 or biased != (down_bias is not None) or \
            biased and (gate_up_bias.shape != (experts, 2 * inter) or down_bias.shape != (experts, hidden) or
                        gate_up_bias.stride(1) != 1 or down_bias.stride(1) != 1):  # the kernels would read past them
        raise ValueError(f"moe.experts: x {tuple(x.shape)} needs gate_up ({experts}, {2 * inter}, {hidden}) and "
                         f"down ({experts}, {hidden}, {inter}), unit-stride rows, both biases or none; got gate_up "
                         f"{tuple(gate_up.shape)}, down {tuple(down.shape)}")
    pairs = topk_ids.numel()
    # under expert parallelism no block writes the slots of other ranks' experts: they stay zero
    out = (torch.zeros if ep > 1 else torch.empty)((tokens, top_k, hidden), dtype=x.dtype, device=x.device)
    if pairs == 0:
        return out.sum(dim=1)
    rows, block_expert = align_blocks(topk_ids, experts, block_m)
    weights = topk_weights.reshape(-1).contiguous()
    h = torch.empty((pairs, inter), dtype=x.dtype, device=x.device)
    # fp32 inputs: three TF32 products per multiply keep fp32 accuracy (see linear.py)
    precision = "tf32x3" if x.dtype == torch.float32 else "tf32"
    blocks = block_expert.numel()
    meta = dict(BLOCK_M=block_m, BLOCK_K=block_k, GROUP_M=group_m, DOT_PRECISION=precision, HAS_BIAS=biased,
                num_warps=warps, num_stages=stages)
    _gate_up_kernel[(blocks * triton.cdiv(2 * inter, block_n),)](
        x, gate_up, gate_up_bias, rows, block_expert, h, pairs, blocks, hidden, inter, top_k, x.stride(0),
        *gate_up.stride(), gate_up_bias.stride(0) if biased else 0, BLOCK_N=block_n, INTERLEAVED=interleaved,
        ALPHA=float(alpha), LIMIT=float(limit), **meta)
    _down_kernel[(blocks * triton.cdiv(hidden, block_n),)](
        h, down, down_bias, rows, block_expert, weights, out, pairs, blocks, hidden, inter, *down.stride(),
        down_bias.stride(0) if biased else 0, BLOCK_N=block_n, **meta)
    return out.sum(dim=1)


@launcher
@triton.jit(do_not_specialize=["tokens"])
def _router_kernel(logits_ptr, weights_ptr, ids_ptr, tokens, experts, stride, TOP_K: tl.constexpr,
                   RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """One token per program: softmax over its experts in fp32, then top_k rounds of argmax, each
    taking the expert out of the next round; the picks renormalised to sum to 1 with RENORM."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    logits = tl.load(logits_ptr + row * stride + cols, mask=cols < experts, other=float("-inf")).to(tl.float32)
    exp = tl.exp(logits - tl.max(logits, axis=0))
    probs = tl.where(cols < experts, exp / tl.sum(exp, axis=0), -1.0)  # padding never picked
    slots = tl.arange(0, BLOCK_K)
    weights = tl.zeros((BLOCK_K,), dtype=tl.float32)
    ids = tl.zeros((BLOCK_K,), dtype=tl.int64)
    for slot in tl.static_range(TOP_K):
        best = tl.argmax(probs, axis=0)
        weights = tl.where(slots == slot, tl.max(probs, axis=0), weights)
        ids = tl.where(slots == slot, best.to(tl.int64), ids)
        probs = tl.where(cols == best, -1.0, probs)
    if RENORM:
        weights = weights / tl.sum(weights, axis=0)
    tl.store(weights_ptr + row * TOP_K + slots, weights, mask=slots < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slots, ids, mask=slots < TOP_K)


def moe_router(logits, top_k: int, renorm: bool, *, warps: int):
    tokens, experts = logits.shape
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int64, device=logits.device)
    if tokens:
        _router_kernel[(tokens,)](logits, weights, ids, tokens, experts, logits.stride(0), TOP_K=top_k,
                                  RENORM=renorm, BLOCK_E=triton.next_power_of_2(experts),
                                  BLOCK_K=triton.next_power_of_2(top_k), num_warps=warps)
    return weights, ids
