"""PyTorch scaled_dot_product_attention, default dispatch and each forced backend."""
from __future__ import annotations

import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..specs import HEAD_DIM_ANY, KernelSpec
from .eager import ALL_DTYPES, BOTH

HALF = frozenset({"bf16", "fp16"})
ATTENTION = frozenset({"attention.prefill", "attention.decode"})
CAUSAL_GQA = frozenset({"causal", "gqa"})


def sdpa(q, k, v, causal: bool, scale: float | None):
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def forced(backend: SDPBackend):
    def run(q, k, v, causal: bool, scale: float | None):
        with sdpa_kernel([backend]):
            return sdpa(q, k, v, causal, scale)
    run.__name__ = f"sdpa_{backend.name.lower()}"
    return run


SPECS = [
    KernelSpec("sdpa.default", ATTENTION, "torch", sdpa, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=CAUSAL_GQA, graph_safe=True,
               notes="PyTorch's own backend choice; the attention fallback"),
    KernelSpec("sdpa.flash", ATTENTION, "torch", forced(SDPBackend.FLASH_ATTENTION), platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=CAUSAL_GQA,
               graph_safe=True, notes="FlashAttention-2 inside PyTorch"),
    KernelSpec("sdpa.cpu_flash", ATTENTION, "torch", forced(SDPBackend.FLASH_ATTENTION),
               platforms=frozenset({"cpu"}), dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=CAUSAL_GQA, graph_safe=True, notes="PyTorch's blocked CPU flash attention"),
    KernelSpec("sdpa.efficient", ATTENTION, "torch", forced(SDPBackend.EFFICIENT_ATTENTION),
               platforms=frozenset({"cuda"}), min_sm=50, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               head_dim_multiple=8, features=frozenset({"causal"}), graph_safe=True,
               notes="memory-efficient (xformers) kernel; refuses GQA without expanded K/V"),
    KernelSpec("sdpa.cudnn", ATTENTION, "torch", forced(SDPBackend.CUDNN_ATTENTION), platforms=frozenset({"cuda"}),
               min_sm=80, dtypes=HALF, head_dim_max=256, head_dim_multiple=8, features=CAUSAL_GQA,
               graph_safe=True),
    KernelSpec("sdpa.math", ATTENTION, "torch", forced(SDPBackend.MATH), platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=CAUSAL_GQA, graph_safe=True, deterministic=True),
]
