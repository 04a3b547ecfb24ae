"""PyTorch scaled_dot_product_attention: the default dispatch, and each backend called directly.

The forced backends call the backend's own aten op rather than entering
`sdpa_kernel([backend])` around the public function: that context manager costs
tens of microseconds per call (flag save/restore), which eager-mode timings would
charge to the kernel. The aten ops skip SDPA's input checks, so each spec
declares exactly what its op accepts (head-dim multiple of 8 where the public
path would pad; no GQA for the efficient kernel, which needs expanded K/V).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import ALL_DTYPES, HALF
from ..ops.attention import alibi_bias, effective_window, visible_keys, with_sinks
from ..specs import BOTH, HEAD_DIM_ANY, KernelSpec

ATTENTION = frozenset({"attention.prefill", "attention.decode"})
CAUSAL_GQA = frozenset({"causal", "gqa"})
# qk_norm only says q and k come from a per-head norm: every attention kernel that takes q and k
# as given (all of ours) composes with it
ATTENTION_FEATURES = CAUSAL_GQA | {"qk_norm"}
SINKS = frozenset({"sinks"})  # kernels that return each row's log-sum-exp (eager.with_sinks)
# v's head dim other than q's and k's (MLA, attention's dv): SDPA's default and math paths take it
# (the default picks a backend that does); the flash ops refuse it ("Q/K/V should have the same head
# size", CPU and CUDA alike); the efficient and cuDNN ops are not declared for it, unchecked here
V_HEAD_DIM = frozenset({"v_head_dim"})
aten = torch.ops.aten


def sdpa(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None,
         alibi: bool = False):
    """A sliding window goes in as an explicit boolean mask (SDPA's is_causal cannot say it), ALiBi
    as an additive float mask in q's dtype (its biases relative to each query's position, <= 0 on
    the keys it sees, the hidden keys -inf); softcap and sinks are never passed: this kernel does
    not declare them, so it is never chosen for one."""
    seq_q, kv_len = q.shape[2], k.shape[2]
    window = effective_window(seq_q, kv_len, causal, window)
    keep = visible_keys(seq_q, kv_len, causal, window, q.device) if window or alibi else None
    if alibi:
        bias = alibi_bias(q.shape[1], seq_q, kv_len, causal, q.device)
        keep = (bias if keep is None else bias.masked_fill(~keep, float("-inf"))).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal and keep is None, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


# The flash, efficient and cuDNN ops return each row's log-sum-exp beside the output, so with it
# they serve attention sinks too (eager.with_sinks): one elementwise pass after the kernel.
def flash(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    return out if sinks is None else with_sinks(out, lse, sinks)


def cpu_flash(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out if sinks is None else with_sinks(out, lse, sinks)


def efficient(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, None, sinks is not None, 0.0, causal,
                                                            scale=scale)[:2]
    # its log-sum-exp is padded to a multiple of 32 queries
    return out if sinks is None else with_sinks(out, lse[..., :q.shape[2]], sinks)


def cudnn(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, sinks is not None, 0.0, causal, False,
                                                        scale=scale)[:2]
    return out if sinks is None else with_sinks(out, lse.reshape(q.shape[:3]), sinks)


def math_backend(q, k, v, causal: bool, scale: float | None):
    return aten._scaled_dot_product_attention_math(q, k, v, None, 0.0, causal, None, scale=scale,
                                                   enable_gqa=q.shape[1] != k.shape[1])[0]


SPECS = [
    KernelSpec("sdpa.default", ATTENTION, "torch", sdpa, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=ATTENTION_FEATURES | V_HEAD_DIM | {"sliding_window", "alibi"},
               graph_safe=True, notes="PyTorch's own backend choice; the attention fallback; a sliding window as a "
                                      "boolean mask, ALiBi as a float one"),
    KernelSpec("sdpa.flash", ATTENTION, "torch", flash, platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=ATTENTION_FEATURES | SINKS,
               graph_safe=True, notes="FlashAttention-2 inside PyTorch"),
    KernelSpec("sdpa.cpu_flash", ATTENTION, "torch", cpu_flash,
               platforms=frozenset({"cpu"}), dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=ATTENTION_FEATURES | SINKS, graph_safe=True, notes="PyTorch's blocked CPU flash attention"),
    KernelSpec("sdpa.efficient", ATTENTION, "torch", efficient,
               platforms=frozenset({"cuda"}), min_sm=50, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               head_dim_multiple=8, features=frozenset({"causal", "qk_norm"}) | SINKS, graph_safe=True,
               notes="memory-efficient (xformers) kernel; refuses GQA without expanded K/V"),
    KernelSpec("sdpa.cudnn", ATTENTION, "torch", cudnn, platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=ATTENTION_FEATURES | SINKS,
               graph_safe=True),
    KernelSpec("sdpa.math", ATTENTION, "torch", math_backend, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=ATTENTION_FEATURES | V_HEAD_DIM, graph_safe=True, deterministic=True),
]
