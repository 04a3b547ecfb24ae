"""PyTorch built-in fused ops: F.rms_norm, F.layer_norm, F.embedding and F.linear (cuBLAS on CUDA)."""
from __future__ import annotations

import torch.nn.functional as F

from ..specs import HEAD_DIM_ANY, KernelSpec
from ..dtypes import ALL_DTYPES
from .eager import BOTH, UNIT_OFFSET, scaled


def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    """Over the last dim; also norm.qk's per-head norm, x (..., heads, d) with weight (d,)."""
    if unit_offset:  # Gemma: normalise and scale by (1 + weight) in fp32, one rounding at the end
        return F.rms_norm(x.float(), (x.shape[-1],), 1.0 + weight.float(), eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False):
    total = x + residual
    return rms_norm(total, weight, eps, unit_offset), total


def layer_norm(x, weight, bias, eps: float):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


def embedding(ids, table, scale: float | None):
    return scaled(F.embedding(ids, table), scale)


def learned_positions(x, positions, table):
    return x + F.embedding(positions, table)


SPECS = [
    KernelSpec("torch.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               features=UNIT_OFFSET, graph_safe=True, deterministic=True),
    KernelSpec("torch.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add,
               platforms=BOTH, dtypes=ALL_DTYPES, features=UNIT_OFFSET, graph_safe=True, deterministic=True,
               notes="an add, then F.rms_norm"),
    KernelSpec("torch.qk_norm", frozenset({"norm.qk"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=UNIT_OFFSET, graph_safe=True, deterministic=True,
               notes="F.rms_norm over each head"),
    KernelSpec("torch.layer_norm", frozenset({"norm.layer"}), "torch", layer_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"no_bias"}), graph_safe=True, deterministic=True),
    KernelSpec("torch.linear", frozenset({"linear"}), "torch", linear, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"bias"}), graph_safe=True, notes="cuBLAS on CUDA, oneDNN/MKL on CPU"),
    KernelSpec("torch.embedding", frozenset({"embedding"}), "torch", embedding, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"scaled"}), graph_safe=True, deterministic=True,
               notes="F.embedding (index_select) rather than advanced indexing"),
    KernelSpec("torch.learned_positions", frozenset({"posenc.learned"}), "torch", learned_positions,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True,
               notes="F.embedding of the positions, then an add"),
]
