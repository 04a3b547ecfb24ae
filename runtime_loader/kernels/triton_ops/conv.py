"""conv.causal_depthwise in one launch: Qwen3.5's short causal depthwise conv1d (+ bias, + SiLU)
over (block_t tokens, block_c channels) tiles, the new state written by the last token block.

Why our own beside FLA's: in an eager layer the conv's cost is mostly the host's. FLA's wrapper
(an autograd Function, input guards, its own launcher) takes some 200 us of host time a call on the
H100 host, more than the GPU time it saves at prompt lengths up to a few thousand tokens
(benchmarks/qwen35_linear_attention.py); ours costs a fifth to a half of FLA's time per call there, at FLA's GPU time.

x is read through its batch and token strides (it arrives as columns of the fused q/k/v
projection); taps before the first token read the state (the last `width` inputs, oldest
first) or zeros. A decode step of one token block rolls the state it was handed in place.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launcher


@launcher
@triton.jit
def _conv_kernel(x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, new_state_ptr, seq, channels, x_stride_b, x_stride_t,
                 WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr,
                 SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_t, pid_c, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    tokens = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_cols = cols < channels
    x_base = x_ptr + batch * x_stride_b
    state_base = state_ptr + batch * channels * WIDTH + cols * WIDTH  # state (batch, channels, width)
    valid = (tokens < seq)[:, None] & in_cols[None, :]
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for tap in tl.static_range(WIDTH):
        source = tokens + (tap + 1 - WIDTH)  # the input position tap reads; < 0: the state's
        value = tl.load(x_base + source[:, None] * x_stride_t + cols[None, :], mask=valid & (source >= 0)[:, None],
                        other=0.0).to(tl.float32)
        if HAS_STATE:
            past = tl.load(state_base[None, :] + (source + WIDTH)[:, None], mask=valid & (source < 0)[:, None],
                           other=0.0).to(tl.float32)
            value += past
        weight = tl.load(w_ptr + cols * WIDTH + tap, mask=in_cols, other=0.0).to(tl.float32)
        acc += value * weight[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=in_cols, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + batch * seq * channels + tokens[:, None] * channels + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=valid)
    # the new state: inputs seq - width .. seq - 1 (state, then x). Names of their own: a runtime `if`
    # may not give a variable of the tap loop another shape
    if pid_t == tl.num_programs(0) - 1:
        slots = tl.arange(0, WIDTH_P2)
        slot_source = seq - WIDTH + slots
        slot_mask = (slots < WIDTH)[:, None] & in_cols[None, :]
        kept = tl.load(x_base + slot_source[:, None] * x_stride_t + cols[None, :],
                       mask=slot_mask & (slot_source >= 0)[:, None], other=0.0)
        if HAS_STATE:
            kept_past = tl.load(state_base[None, :] + (slot_source + WIDTH)[:, None],
                                mask=slot_mask & (slot_source < 0)[:, None], other=0.0)
            kept = tl.where((slot_source < 0)[:, None], kept_past.to(kept.dtype), kept)
        tl.debug_barrier()  # every read of the state done before it is rolled in place
        new_state_base = new_state_ptr + batch * channels * WIDTH + cols * WIDTH
        tl.store(new_state_base[None, :] + slots[:, None], kept.to(new_state_ptr.dtype.element_ty), mask=slot_mask)


def causal_conv1d(x, weight, bias, state, silu: bool, *, block_t: int, block_c: int, warps: int):
    batch, seq, channels = x.shape
    width = weight.shape[1]
    if x.stride(2) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    out = torch.empty((batch, seq, channels), dtype=x.dtype, device=x.device)
    if seq == 0:  # no input: the state stays what it was (zeros without one)
        kept = state if state is not None else torch.zeros((batch, channels, width), device=x.device)
        return out, kept.to(x.dtype)
    token_blocks = triton.cdiv(seq, block_t)
    # one token block reads the state and writes the new one in the same program: in place is safe
    in_place = (state is not None and token_blocks == 1 and state.is_contiguous() and state.dtype == x.dtype)
    new_state = state if in_place else torch.empty((batch, channels, width), dtype=x.dtype, device=x.device)
    if state is not None and not state.is_contiguous():
        state = state.contiguous()
    if batch and seq:
        _conv_kernel[(token_blocks, triton.cdiv(channels, block_c), batch)](
            x, weight, bias if bias is not None else weight, state if state is not None else x, out, new_state,
            seq, channels, x.stride(0), x.stride(1),
            WIDTH=width, WIDTH_P2=triton.next_power_of_2(width), HAS_BIAS=bias is not None,
            HAS_STATE=state is not None, SILU=silu, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=warps)
    return out, new_state
