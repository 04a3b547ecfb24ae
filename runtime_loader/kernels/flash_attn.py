"""FlashAttention adapters: FA3's forward (the fa3-fwd wheel, Hopper), FA2 (flash-attn) and FA4
(flash-attn-4: CuTe DSL, Hopper and Blackwell).

Both take q, k, v as (batch, seq, heads, d) and need only the last dim at unit stride
(every other stride is passed to the kernel), so our (batch, heads, seq, d) tensors go
in as transposed views and the output comes back the same way: no copies.

FA aligns the causal mask to the bottom-right corner, SDPA (our contract) to the
top-left; the two agree only when seq_q == kv_len, which attention.prefill always has
(attention.decode is not causal). A causal call with seq_q != kv_len is refused, so it
can never silently mean something else. A sliding window is FA's window_size (left
window - 1, right 0 under a causal mask), aligned the same way; softcap is FA's own.
Attention sinks take the row log-sum-exps FA returns (ops.attention.with_sinks).
The fa3-fwd wheel is built with FLASHATTENTION_DISABLE_LOCAL (fa3_fwd_config.py), so
FA3 declares softcap but no sliding window. Neither declares a v head dim other than q's
(attention's dv, MLA): FA2 has one head dim for q, k and v; FA3's hdim_v kernels are not
checked against this wheel. FA4 takes q/k and v head dims of 8-256 apart on sm90 (its
_validate_head_dims), so it declares v_head_dim: DeepSeek's 192/128.
"""
from __future__ import annotations

from ..dtypes import HALF
from ..ops.attention import with_sinks
from ..specs import KernelSpec
from .sdpa import ATTENTION, ATTENTION_FEATURES, SINKS


def fa_layout(t):
    """(batch, heads, seq, d) <-> (batch, seq, heads, d): a view; the last dim keeps its unit stride."""
    return t.transpose(1, 2)


def check_causal_alignment(q, k, causal: bool) -> None:
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"FlashAttention's causal mask is bottom-right aligned, SDPA's top-left: they differ "
                         f"when seq_q ({q.shape[2]}) != kv_len ({k.shape[2]})")


def window_size(window: int, causal: bool) -> tuple[int, int]:
    """Our window (keys j > position - window) as FA's (left, right); -1 is unbounded."""
    return (window - 1, 0 if causal else -1) if window else (-1, -1)


def fa3_splits(causal: bool) -> int:
    """FA3's num_splits: 0 lets FA3 split the KV from the shape, 1 never splits.

    Decode (not causal) needs the split: with batch * kv heads small, one split leaves most SMs
    idle (H100, benchmarks/archive/fa3_splits.py: 1.3-20x slower unsplit). A causal prefill must not split: when
    it fills under 0.8 of the SMs, FA3's heuristic splits it anyway and pays for a combine pass,
    which made cliffs of up to 1.85x a few tokens wide (3 x 530 tokens: 32.5 against 17.4 µs
    unsplit) and never gained more than noise.
    """
    return 1 if causal else 0


def fa3(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    check_causal_alignment(q, k, causal)
    if window:
        raise ValueError("the fa3-fwd wheel is built without sliding-window (local) attention")
    from fa3_fwd_interface import flash_attn_func

    # return_attn_probs: (out, row log-sum-exp (batch, heads, seq_q)), for sinks
    out = flash_attn_func(fa_layout(q), fa_layout(k), fa_layout(v), softmax_scale=scale, causal=causal,
                          softcap=softcap, num_splits=fa3_splits(causal), return_attn_probs=sinks is not None)
    return fa_layout(out) if sinks is None else with_sinks(fa_layout(out[0]), out[1], sinks)


def fa2(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    check_causal_alignment(q, k, causal)
    from flash_attn import flash_attn_func

    out = flash_attn_func(fa_layout(q), fa_layout(k), fa_layout(v), softmax_scale=scale, causal=causal,
                          window_size=window_size(window, causal), softcap=softcap,
                          return_attn_probs=sinks is not None)  # (out, row log-sum-exp, probabilities)
    return fa_layout(out) if sinks is None else with_sinks(fa_layout(out[0]), out[1], sinks)


def fa4(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    check_causal_alignment(q, k, causal)
    from flash_attn.cute import flash_attn_func

    # FA4's window bounds are None where unbounded; num_splits as FA3's (< 1: its heuristic);
    # it always returns (out, row log-sum-exp)
    out, lse = flash_attn_func(fa_layout(q), fa_layout(k), fa_layout(v), softmax_scale=scale, causal=causal,
                               window_size=(window - 1, 0 if causal else None) if window else (None, None),
                               softcap=softcap, num_splits=fa3_splits(causal))
    return fa_layout(out) if sinks is None else with_sinks(fa_layout(out), lse, sinks)


# What a device call carries is 64 MiB: FA4 and QuACK need NVIDIA's CuTe DSL, whose CUDA 13 libraries
# (nvidia-cutlass-dsl-libs-cu13 4.8.1) are a 92.0 MB wheel, 227 MB unpacked, 66.1 MB as tar.xz
# (measured 2026-12-05): they have not run on the lent GPUs yet.
CUTE_DSL = "needs nvidia-cutlass-dsl (its CUDA 13 libraries: a 92.0 MB wheel)"

SPECS = [
    # fa3_fwd_config.py: FP16 kernels disabled (bf16 only; fp8 is outside our dtypes), head dims
    # 64/96/128/192/256 built, a smaller d runs in the 64 kernel; mha_fwd wants d % 8 == 0, d <= 256.
    KernelSpec("fa3.attention", ATTENTION, "fa3-fwd", fa3, platforms=frozenset({"cuda"}), min_sm=90, max_sm=90,
               dtypes=frozenset({"bf16"}), head_dim_max=256, head_dim_multiple=8,
               features=ATTENTION_FEATURES | SINKS | {"softcap"},
               graph_safe=True, deterministic=True, requires=("fa3_fwd_interface",),
               notes="FlashAttention-3 forward (fa3-fwd wheel), Hopper only; split-KV by FA3's heuristic for decode, never for a causal prefill"),
    KernelSpec("fa2.attention", ATTENTION, "flash-attn", fa2, platforms=frozenset({"cuda"}), min_sm=80, max_sm=90,
               dtypes=HALF, head_dim_max=256, head_dim_multiple=8,
               features=ATTENTION_FEATURES | SINKS | {"sliding_window", "softcap"},
               graph_safe=True, deterministic=True, requires=("flash_attn.flash_attn_interface",),
               notes="FlashAttention-2 (Ampere, Ada, Hopper per its README); written from the documented "
                     "flash_attn_func API, not yet run; d % 8 != 0 would be padded (a copy), so not declared"),
    # the sm90 forward of flash-attn-4 4.0.0b40 (flash_fwd_sm90.py); fp8 is outside our dtypes
    KernelSpec("fa4.attention", ATTENTION, "flash-attn-4", fa4, platforms=frozenset({"cuda"}), min_sm=90,
               dtypes=HALF, head_dim_max=256, head_dim_multiple=8,
               features=ATTENTION_FEATURES | SINKS | {"sliding_window", "softcap", "v_head_dim"},
               graph_safe=True, deterministic=True, jit=True, requires=("flash_attn.cute",),
               slow_start=True,  # the CuTe DSL's import, and its kernels compiled in process memory
               notes=f"FlashAttention-4 (CuTe DSL), compiled per configuration at its first call; {CUTE_DSL}; "
                     "4.0.0b40's flash_attn.cute.flash_attn_func; its parity cases pass on an H100"),
]
