"""PyTorch built-in fused ops: F.rms_norm, F.layer_norm and F.linear (cuBLAS on CUDA)."""
from __future__ import annotations

import torch.nn.functional as F

from ..specs import KernelSpec
from .eager import ALL_DTYPES, BOTH


def rms_norm(x, weight, eps: float):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_add(x, residual, weight, eps: float):
    total = x + residual
    return F.rms_norm(total, (total.shape[-1],), weight, eps), total


def layer_norm(x, weight, bias, eps: float):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def linear(x, weight, bias=None):
    return F.linear(x, weight, bias)


SPECS = [
    KernelSpec("torch.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("torch.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True,
               notes="an add, then F.rms_norm"),
    KernelSpec("torch.layer_norm", frozenset({"norm.layer"}), "torch", layer_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("torch.linear", frozenset({"linear"}), "torch", linear, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"bias"}), graph_safe=True, notes="cuBLAS on CUDA, oneDNN/MKL on CPU"),
]
