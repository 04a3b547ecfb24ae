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
# BLOOM's linear position biases: the ops that take an additive float mask (SDPA's default, math and
# CPU flash) serve them as one (alibi_mask); the flash, efficient and cuDNN CUDA ops are not declared for it
ALIBI = frozenset({"alibi"})
aten = torch.ops.aten


def alibi_mask(q, k, causal: bool, keep=None):
    """ALiBi's biases as an additive float mask in q's dtype, (1, q heads, seq_q, kv_len): relative to
    each query's position (<= 0 on the keys it sees, so the dtype keeps them exact where they
    matter), the keys it does not see (causal, or `keep`'s False) -inf."""
    seq_q, kv_len = q.shape[2], k.shape[2]
    bias = alibi_bias(q.shape[1], seq_q, kv_len, causal, q.device)
    if keep is None and causal:
        keep = visible_keys(seq_q, kv_len, causal, 0, q.device)
    if keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return bias.to(q.dtype)[None]


def sdpa(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None,
         alibi: bool = False):
    """A sliding window goes in as an explicit boolean mask (SDPA's is_causal cannot say it), ALiBi
    as an additive float one (alibi_mask); softcap and sinks are never passed: this kernel does not
    declare them, so it is never chosen for one."""
    window = effective_window(q.shape[2], k.shape[2], causal, window)
    keep = visible_keys(q.shape[2], k.shape[2], causal, window, q.device) if window else None
    if alibi:
        keep = alibi_mask(q, k, causal, keep)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal and keep is None, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


# The flash, efficient and cuDNN ops return each row's log-sum-exp beside the output, so with it
# they serve attention sinks too (eager.with_sinks): one elementwise pass after the kernel.
def flash(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None):
    out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    return out if sinks is None else with_sinks(out, lse, sinks)


def cpu_flash(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None,
              alibi: bool = False):
    """ALiBi as an additive float mask (alibi_mask), which this op takes (4-D) in place of is_causal."""
    mask = alibi_mask(q, k, causal) if alibi else None
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal and mask is None, attn_mask=mask,
                                                                scale=scale)
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


def math_backend(q, k, v, causal: bool, scale: float | None, window: int = 0, softcap: float = 0.0, sinks=None,
                 alibi: bool = False):
    """ALiBi as an additive float mask (alibi_mask); window, softcap and sinks are never passed (not declared)."""
    mask = alibi_mask(q, k, causal) if alibi else None
    return aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, causal and mask is None, None, scale=scale,
                                                   enable_gqa=q.shape[1] != k.shape[1])[0]


SPECS = [
    KernelSpec("sdpa.default", ATTENTION, "torch", sdpa, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=ATTENTION_FEATURES | V_HEAD_DIM | ALIBI | {"sliding_window"},
               graph_safe=True, notes="PyTorch's own backend choice; the attention fallback; a sliding window as a "
                                      "boolean mask, ALiBi as a float one"),
    KernelSpec("sdpa.flash", ATTENTION, "torch", flash, platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=ATTENTION_FEATURES | SINKS,
               graph_safe=True, notes="FlashAttention-2 inside PyTorch"),
    KernelSpec("sdpa.cpu_flash", ATTENTION, "torch", cpu_flash,
               platforms=frozenset({"cpu"}), dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=ATTENTION_FEATURES | SINKS | ALIBI, graph_safe=True,
               notes="PyTorch's blocked CPU flash attention; ALiBi as a float mask"),
    KernelSpec("sdpa.efficient", ATTENTION, "torch", efficient,
               platforms=frozenset({"cuda"}), min_sm=50, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               head_dim_multiple=8, features=frozenset({"causal", "qk_norm"}) | SINKS, graph_safe=True,
               notes="memory-efficient (xformers) kernel; refuses GQA without expanded K/V"),
    KernelSpec("sdpa.cudnn", ATTENTION, "torch", cudnn, platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=ATTENTION_FEATURES | SINKS,
               graph_safe=True),
    KernelSpec("sdpa.math", ATTENTION, "torch", math_backend, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=ATTENTION_FEATURES | V_HEAD_DIM | ALIBI, graph_safe=True,
               deterministic=True),
]
