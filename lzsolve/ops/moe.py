"""Mixture-of-experts layers: the router's choice (moe.router) and the routed experts (moe.experts).

moe.router: the top_k experts of softmax(logits) per token, weights (renormalised to sum to 1
with the renorm flag) and ids, in descending order.

moe.experts: the gated expert MLPs over the tokens routed to them.

Each token goes to top_k of `experts` experts with the router's weights; expert e computes
down[e] @ act(gate, up) (+ down_bias[e]) with [gate; up] = gate_up[e] @ x (+ gate_up_bias[e]),
and a token's output is the weighted sum of its experts' outputs. act is SwiGLU, silu(gate) *
up, or with a limit GPT-OSS's clamped form: gate clamped above at limit, up to [-limit, limit],
gate * sigmoid(alpha * gate) * (up + 1). gate_up holds the gate rows then the up rows, or with
the interleaved flag gate and up rows in turn (GPT-OSS). Under expert parallelism (ep ranks), the
weights are this rank's experts only and a slot routed to another rank's has an id >= their count
(and weight 0): it adds nothing. FLOPs and bytes count the routed work only: top_k expert MLPs per
token (1/ep of them on a rank), and the weights of the experts some token reaches.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from lzsolve.ops.base import OpContract, itemsize
from runtime_loader.inputs import routing_skew
from runtime_loader.ops.moe import routing


def reference(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
              alpha=0.0, limit=0.0, ep=1):
    """One expert at a time, over the (token, slot) pairs routed to it; another rank's slots skipped."""
    out = torch.zeros_like(x)
    for expert in topk_ids[topk_ids < gate_up.shape[0]].unique().tolist():
        tokens, slots = torch.where(topk_ids == expert)
        h = F.linear(x[tokens], gate_up[expert], None if gate_up_bias is None else gate_up_bias[expert])
        gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else h.chunk(2, dim=-1)
        if limit:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            act = gate * torch.sigmoid(alpha * gate) * (up + 1)
        else:
            act = F.silu(gate) * up
        rows = F.linear(act, down[expert], None if down_bias is None else down_bias[expert])
        out.index_add_(0, tokens, rows * topk_weights[tokens, slots, None])
    return out


SAMPLE_TOKENS = 8192  # pick_rates' draw: its rarest experts' rates within ~10% where they matter


@functools.lru_cache(maxsize=256)
def pick_rates(experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """Per expert, the chance that a token's top_k holds it, for routings drawn with `skew` as the
    measured inputs are (runtime_loader.ops.moe.routing): top_k / experts each without a skew; with
    one, each expert's share of a seeded draw of SAMPLE_TOKENS tokens. A skewed routing reaches far
    fewer experts than a uniform one (256 experts, top 8, 64 tokens: about 50 at skew 3, 222 uniform),
    so counting the uniform's weights would put a kernel at 4x its roofline."""
    if skew == 0 or experts == 1:
        return (top_k / experts,) * experts
    ids, _ = routing(SAMPLE_TOKENS, experts, top_k, torch.float32, "cpu", torch.Generator().manual_seed(0), skew)
    return tuple((torch.bincount(ids.flatten(), minlength=experts) / SAMPLE_TOKENS).tolist())


def experts_reached(sig, tokens: int) -> float:
    """The expected number of this rank's experts at least one of `tokens` tokens is routed to,
    under the routing skew the inputs are drawn with (routing_skew()). Tokens pick independently,
    and the rank holds `experts` of all ranks' experts at random places in their popularity."""
    experts, top_k, ep = sig.dim("experts"), sig.dim("top_k"), sig.dim("ep")
    rates = pick_rates(experts * ep, top_k, routing_skew())
    return experts / len(rates) * sum(1 - (1 - rate) ** tokens for rate in rates)


def flops(sig, dims):
    return 6.0 * dims["tokens"] * sig.dim("top_k") / sig.dim("ep") * sig.dim("hidden") * sig.dim("inter")


def bytes_moved(sig, dims):
    tokens, hidden, inter = dims["tokens"], sig.dim("hidden"), sig.dim("inter")
    weights = experts_reached(sig, tokens) * (3 * inter * hidden + (2 * inter + hidden) * ("bias" in sig.flags))
    routing = tokens * sig.dim("top_k") * (8 + itemsize(sig))  # int64 ids and the weights, every slot
    return float(itemsize(sig) * (2 * tokens * hidden + weights) + routing)


def shape(experts: int, top_k: int, hidden: int, inter: int) -> dict:
    return {"experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter}


EXPERTS = OpContract("moe.experts", reference, flops, bytes_moved, (
    (shape(4, 2, 32, 48), (), {"tokens": 5}),  # fewer tokens than experts x slots: some expert idle
    (shape(8, 2, 64, 96), (), {"tokens": 33}),  # odd widths and token count: no tile is full
    (shape(16, 4, 128, 64), (), {"tokens": 1}),  # decode: one token, top_k experts
    # a rank of four under expert parallelism: 3 of 12 experts, most slots another rank's
    ({**shape(3, 2, 32, 48), "ep": 4}, (), {"tokens": 9}),
    # GPT-OSS's experts (weights stored (experts, in, out), biases, gate and up rows in turn), with a
    # limit low enough that both clamps bite
    ({**shape(6, 2, 48, 40), "alpha": 1.702, "limit": 0.5}, ("interleaved", "bias", "transposed"), {"tokens": 11}),
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

CONTRACTS = (ROUTER, EXPERTS)
