"""PyTorch built-in fused ops: F.rms_norm, F.layer_norm, F.embedding, F.linear (cuBLAS on CUDA) and
the grouped GEMM over expert segments (transformers' default experts implementation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dtypes import ALL_DTYPES
from ..ops.embedding import scaled
from ..ops.moe import EXPERT_FORMS, expert_activation
from ..ops.norm import KEEP_INPUTS, UNIT_OFFSET
from ..quant import quantize_per_token
from ..specs import BOTH, HEAD_DIM_ANY, KernelSpec


def rms_norm(x, weight, eps: float, unit_offset: bool = False):
    """Over the last dim; also norm.qk's per-head norm, x (..., heads, d) with weight (d,)."""
    if unit_offset:  # Gemma: normalise and scale by (1 + weight) in fp32, one rounding at the end
        return F.rms_norm(x.float(), (x.shape[-1],), 1.0 + weight.float(), eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rms_norm_add(x, residual, weight, eps: float, unit_offset: bool = False, keep_inputs: bool = False):
    """New tensors, whether or not the call asks for them (keep_inputs)."""
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


def expert_segments(topk_ids, experts: int):
    """(order, offsets): the (token, slot) pairs of topk_ids (flattened) sorted by expert, and
    where each expert's segment ends. histc, not bincount: its output size does not depend on
    the data, so no host sync and the call can be captured in a CUDA graph."""
    sorted_ids, order = torch.sort(topk_ids.reshape(-1))
    counts = torch.histc(sorted_ids.float() if not sorted_ids.is_cuda else sorted_ids.int(), bins=experts, min=0,
                         max=experts - 1)
    return order, torch.cumsum(counts, dim=0, dtype=torch.int32)


def grouped_mm(rows, weights, offsets):
    """rows (S, k) in expert segments @ weights (experts, k, n): torch's grouped GEMM."""
    grouped = getattr(F, "grouped_mm", None) or torch._grouped_mm
    return grouped(rows, weights, offs=offsets)


def moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                alpha=0.0, limit=0.0, ep=1):
    """transformers' grouped_mm experts: tokens sorted into expert segments, one grouped GEMM for
    gate_up and one for down over every expert (empty segments cost nothing), then the weighted
    rows put back in token order and summed over the slots. Under expert parallelism the other
    ranks' slots sort past the last segment, where the GEMMs leave their rows unwritten: they are
    zeroed before the sum (as transformers does)."""
    tokens, top_k = topk_ids.shape
    experts = gate_up.shape[0]
    order, offsets = expert_segments(topk_ids, experts)
    h = grouped_mm(x[order // top_k], gate_up.transpose(1, 2), offsets)
    experts_of_rows = topk_ids.reshape(-1)[order]
    if ep > 1:
        elsewhere = (experts_of_rows >= experts).unsqueeze(-1)
        experts_of_rows = experts_of_rows.clamp(max=experts - 1)  # the bias gathers stay in bounds
    if gate_up_bias is not None:
        h = h + gate_up_bias[experts_of_rows]
    rows = grouped_mm(expert_activation(h, interleaved, alpha, limit), down.transpose(1, 2), offsets)
    if down_bias is not None:
        rows = rows + down_bias[experts_of_rows]
    rows = rows * topk_weights.reshape(-1)[order, None]
    if ep > 1:
        rows = rows.masked_fill(elsewhere, 0)
    in_token_order = torch.empty_like(rows).index_copy_(0, order, rows)
    # rows' width, not -1, which a view of 0 tokens cannot infer; float32 routing weights promote
    return in_token_order.view(tokens, top_k, rows.shape[-1]).sum(dim=1).to(x.dtype)


def scaled_mm_fp8(x, weight, weight_scale, bias=None):
    """cuBLASLt's FP8 GEMM (torch._scaled_mm) with row-wise scales: x quantised per token (one
    more launch, timed with it: a server pays it), the weight's scales per output channel (a
    per-tensor scale repeated)."""
    rows = x.reshape(-1, x.shape[-1])
    q, scale = quantize_per_token(rows)
    scale_b = weight_scale.float().expand(weight.shape[0]).reshape(1, -1).contiguous()
    out = torch._scaled_mm(q, weight.t(), scale_a=scale, scale_b=scale_b, bias=bias, out_dtype=x.dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def scaled_mm(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16):
    """torch._scaled_mm on an input quantised beforehand: the FP8 GEMM alone, one launch."""
    rows, scale = q.reshape(-1, q.shape[-1]), x_scale.reshape(-1, 1).float()
    scale_b = weight_scale.float().expand(weight.shape[0]).reshape(1, -1).contiguous()
    out = torch._scaled_mm(rows, weight.t(), scale_a=scale, scale_b=scale_b, bias=bias, out_dtype=out_dtype)
    return out.reshape(*q.shape[:-1], weight.shape[0])


SPECS = [
    KernelSpec("torch.rms_norm", frozenset({"norm.rms"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True),
    KernelSpec("torch.rms_norm_add", frozenset({"norm.rms_add"}), "torch", rms_norm_add,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset(UNIT_OFFSET + KEEP_INPUTS), graph_safe=True,
               deterministic=True, notes="an add, then F.rms_norm"),
    KernelSpec("torch.qk_norm", frozenset({"norm.qk"}), "torch", rms_norm, platforms=BOTH, dtypes=ALL_DTYPES,
               head_dim_max=HEAD_DIM_ANY, features=frozenset(UNIT_OFFSET), graph_safe=True, deterministic=True,
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
    KernelSpec("torch.grouped_mm", frozenset({"moe.experts"}), "torch", moe_experts, platforms=BOTH,
               dtypes=ALL_DTYPES, features=EXPERT_FORMS, graph_safe=True, deterministic=True,
               notes="sort by expert, F.grouped_mm for gate_up and down, weighted sum over the slots"),
    # row-wise scaled FP8 GEMMs need Hopper in cuBLASLt; K and N multiples of 16
    KernelSpec("torch.scaled_mm_fp8", frozenset({"linear.fp8"}), "torch", scaled_mm_fp8, platforms=frozenset({"cuda"}),
               min_sm=90, dtypes=frozenset({"bf16", "fp16"}), features=frozenset({"per_channel", "bias"}),
               graph_safe=True, notes="torch._scaled_mm (cuBLASLt FP8) after a per-token quantisation of x"),
    KernelSpec("torch.scaled_mm", frozenset({"linear.fp8_prequantised"}), "torch", scaled_mm,
               platforms=frozenset({"cuda"}), min_sm=90, dtypes=frozenset({"bf16", "fp16"}),
               features=frozenset({"per_channel", "bias"}), graph_safe=True, notes="torch._scaled_mm (cuBLASLt FP8)"),
]
