"""Eager PyTorch implementations: the fallbacks outside the table, written the
way Hugging Face models compute these ops (fp32 statistics, input-dtype math)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..specs import HEAD_DIM_ANY, KernelSpec

ALL_DTYPES = frozenset({"bf16", "fp16", "fp32"})
BOTH = frozenset({"cpu", "cuda"})


def attention(q, k, v, causal: bool, scale: float | None):
    groups = q.shape[1] // k.shape[1]
    if groups != 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if causal:  # SDPA semantics: top-left aligned causal mask
        seq_q, kv_len = q.shape[2], k.shape[2]
        keep = torch.ones(seq_q, kv_len, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.matmul(scores.softmax(-1).to(q.dtype), v)


def rms_norm(x, weight, eps: float):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rms_norm_add(x, residual, weight, eps: float):
    total = x + residual
    return rms_norm(total, weight, eps), total


def layer_norm(x, weight, bias, eps: float):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    xf = (xf - mean) * torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) * weight + bias


def rotate(x, interleaved: bool):
    """The 90-degree rotation RoPE mixes in: pairs (x1, x2) -> (-x2, x1)."""
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(q, k, cos, sin, interleaved: bool):
    """q: (batch, hq, seq, d), k: (batch, hkv, seq, d), cos/sin: (batch or 1, seq, d)."""
    cos = cos.unsqueeze(1).to(q.dtype)
    sin = sin.unsqueeze(1).to(q.dtype)
    return q * cos + rotate(q, interleaved) * sin, k * cos + rotate(k, interleaved) * sin


def swiglu(gate, up):
    return F.silu(gate) * up


def geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def gelu(x):
    return F.gelu(x, approximate="tanh")


def linear(x, weight, bias=None):
    out = torch.matmul(x, weight.T)
    return out + bias if bias is not None else out


SPECS = [
    KernelSpec("eager.attention", frozenset({"attention.prefill", "attention.decode"}), "torch", attention,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY,
               features=frozenset({"causal", "gqa"}), graph_safe=True, deterministic=True,
               notes="matmul + fp32 softmax + matmul; materialises the score matrix"),
    KernelSpec("eager.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.layer_norm", frozenset({"norm.layer"}), "torch", layer_norm,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.rope", frozenset({"posenc.rope"}), "torch", rope,
               platforms=BOTH, dtypes=ALL_DTYPES, head_dim_max=HEAD_DIM_ANY, head_dim_multiple=2,
               features=frozenset({"gqa", "rope_split_half", "rope_interleaved"}),
               graph_safe=True, deterministic=True),
    KernelSpec("eager.swiglu", frozenset({"act.swiglu"}), "torch", swiglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.geglu", frozenset({"act.geglu"}), "torch", geglu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.gelu", frozenset({"act.gelu"}), "torch", gelu,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True),
    KernelSpec("eager.linear", frozenset({"linear"}), "torch", linear, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"bias"}), graph_safe=True, notes="matmul, then a separate bias add"),
]
