"""Mixture-of-experts layers: the router's choice (moe.router) and the routed experts (moe.experts).

moe.router: the top_k experts of softmax(logits) per token, weights (renormalised to sum to 1
with the renorm flag) and ids, in descending order.

moe.experts: the gated expert MLPs over the tokens routed to them.

Each token goes to top_k of `experts` experts with the router's weights; expert e computes
down[e] @ (silu(gate) * up) with [gate; up] = gate_up[e] @ x, and a token's output is the
weighted sum of its experts' outputs. FLOPs and bytes count the routed work only: top_k
expert MLPs per token, and the weights of the experts some token reaches.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import OpContract, itemsize


def reference(x, topk_ids, topk_weights, gate_up, down):
    """One expert at a time, over the (token, slot) pairs routed to it."""
    out = torch.zeros_like(x)
    for expert in topk_ids.unique().tolist():
        tokens, slots = torch.where(topk_ids == expert)
        gate, up = (x[tokens] @ gate_up[expert].T).chunk(2, dim=-1)
        out.index_add_(0, tokens, (F.silu(gate) * up) @ down[expert].T * topk_weights[tokens, slots, None])
    return out


def experts_reached(sig, tokens: int) -> float:
    """The expected number of experts at least one of `tokens` tokens is routed to (uniform routing)."""
    experts, top_k = sig.dim("experts"), sig.dim("top_k")
    return experts * (1 - (1 - top_k / experts) ** tokens)


def flops(sig, dims):
    return 6.0 * dims["tokens"] * sig.dim("top_k") * sig.dim("hidden") * sig.dim("inter")


def bytes_moved(sig, dims):
    tokens, hidden, inter = dims["tokens"], sig.dim("hidden"), sig.dim("inter")
    weights = experts_reached(sig, tokens) * 3 * inter * hidden
    routing = tokens * sig.dim("top_k") * (8 + itemsize(sig))  # int64 ids and the weights
    return float(itemsize(sig) * (2 * tokens * hidden + weights) + routing)


def shape(experts: int, top_k: int, hidden: int, inter: int) -> dict:
    return {"experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter}


EXPERTS = OpContract("moe.experts", reference, flops, bytes_moved, (
    (shape(4, 2, 32, 48), (), {"tokens": 5}),  # fewer tokens than experts x slots: some expert idle
    (shape(8, 2, 64, 96), (), {"tokens": 33}),  # odd widths and token count: no tile is full
    (shape(16, 4, 128, 64), (), {"tokens": 1}),  # decode: one token, top_k experts
))


def router_reference(logits, top_k: int, renorm: bool):
    weights, ids = logits.float().softmax(dim=-1).topk(top_k, dim=-1)
    return (weights / weights.sum(dim=-1, keepdim=True) if renorm else weights), ids


def router_flops(sig, dims):
    return 5.0 * dims["tokens"] * sig.dim("experts")  # exp, sum, divide; the top-k's comparisons


def router_bytes(sig, dims):
    return float(dims["tokens"] * (itemsize(sig) * sig.dim("experts") + 12 * sig.dim("top_k")))


ROUTER = OpContract("moe.router", router_reference, router_flops, router_bytes, (
    ({"experts": 8, "top_k": 2}, ("renorm",), {"tokens": 7}),  # Mixtral
    ({"experts": 60, "top_k": 4}, (), {"tokens": 5}),  # Qwen2-MoE: no renormalisation, experts not a power of 2
    ({"experts": 128, "top_k": 8}, ("renorm",), {"tokens": 1}),  # Qwen3-MoE at decode
))
