"""Mixture of experts: the router's top-k choice and the experts' gated MLPs over routed tokens
(Mixtral's form, GPT-OSS's interleaved, biased and clamped one, expert parallelism). Their
records, how a call is read, example inputs (routings with a realistic skew) and eager kernels
(the experts' fallback is torch.grouped_mm, runtime_loader.kernels.torch_ops). Contract: lzsolve.ops.moe.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES, DTYPES
from ..inputs import randn, routing_skew
from ..specs import BOTH, KernelSpec
from .base import OpSchema, Signature

# moe.experts beyond Mixtral's form: GPT-OSS's layout, biases and clamped SwiGLU (lzsolve.ops.moe)
EXPERT_FORMS = frozenset({"interleaved", "bias", "transposed", "clamped_swiglu", "expert_parallel"})


def moe_experts_front(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, gate_up: Tensor, down: Tensor,
                      gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, interleaved: bool = False,
                      alpha: float = 0.0, limit: float = 0.0, ep: int = 1):
    """A mixture-of-experts layer's gated expert MLPs over routed tokens: x (tokens, hidden), the
    router's choice topk_ids (tokens, top_k) and weights topk_weights (tokens, top_k); per expert
    e, gate_up[e] (2 * inter, hidden) holds the gate rows then the up rows (interleaved: gate and
    up rows alternate, GPT-OSS), down[e] (hidden, inter), as transformers stores them (or as
    transposed views of weights stored (experts, in, out)); optional biases gate_up_bias (experts,
    2 * inter) and down_bias (experts, hidden). Returns sum over k of weight_k * (down[e_k] @
    act(gate, up) + down_bias[e_k]) with act silu(gate) * up, or with limit > 0 GPT-OSS's
    clamped form: min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clamp(up, +-limit) + 1).
    Under expert parallelism over ep ranks (transformers' convention), gate_up and down hold this
    rank's experts only, and a slot routed to another rank's expert has an id >= their count
    (a sentinel) and weight 0: it adds nothing, and kernels skip it."""
    return ((x.shape, topk_ids.shape, gate_up.shape, x.dtype, x.is_cuda, gate_up.stride(), down.stride(),
             gate_up_bias is None, down_bias is None, interleaved, alpha, limit, ep),
            (x, topk_ids, topk_weights, gate_up, down)
            if gate_up_bias is None and down_bias is None and not interleaved and not limit and ep == 1
            else (x, topk_ids, topk_weights, gate_up, down, gate_up_bias, down_bias, interleaved, alpha, limit, ep))


def is_transposed(weight: Tensor) -> bool:
    """An expert weight (experts, out, in) that is the transposed view of one stored (experts, in, out)."""
    return weight.stride(1) == 1 and weight.stride(2) != 1


def moe_experts_call(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                     alpha=0.0, limit=0.0, ep=1):
    if not isinstance(ep, int) or ep < 1:
        return None
    if (x.dim() != 2 or topk_ids.dim() != 2 or gate_up.dim() != 3 or down.dim() != 3 or x.dtype not in DTYPE_NAMES
            or gate_up.shape[1] != 2 * down.shape[2] or (gate_up_bias is None) != (down_bias is None)):
        return None  # one bias without the other: no signature says so; the fallback computes it
    experts, hidden, inter = gate_up.shape[0], x.shape[1], down.shape[2]
    # alpha means something only with a limit: one signature for every call of the plain form
    static = {"experts": experts, "top_k": topk_ids.shape[1], "hidden": hidden, "inter": inter,
              "alpha": float(alpha) if limit else 0.0, "limit": float(limit), "ep": ep}
    flags = [name for name, on in (("interleaved", interleaved), ("bias", gate_up_bias is not None),
                                   ("transposed", is_transposed(gate_up) and is_transposed(down))) if on]
    return Signature.make("moe.experts", static, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.shape[0]}


def moe_router_front(logits: Tensor, top_k: int, renorm: bool = True):
    """A mixture-of-experts router's choice from its logits (tokens, experts): the top_k experts
    of softmax(logits) in fp32, as (weights float32, ids int64), both (tokens, top_k) in
    descending order; renorm: the weights divided by their sum (softmax over the top_k logits)."""
    return (logits.shape, logits.dtype, logits.is_cuda, top_k, renorm), (logits, top_k, renorm)


def moe_router_call(logits, top_k, renorm=True):
    if logits.dim() != 2 or logits.dtype not in DTYPE_NAMES or not 0 < top_k <= logits.shape[1]:
        return None
    static = {"experts": logits.shape[1], "top_k": top_k}
    return (Signature.make("moe.router", static, ("renorm",) if renorm else (), DTYPE_NAMES[logits.dtype]),
            {"tokens": logits.shape[0]})


def moe_router_fake(logits: Tensor, top_k: int, *args) -> tuple[Tensor, Tensor]:
    shape = (logits.shape[0], top_k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


# --- example inputs ---------------------------------------------------------------------------------
def routing(tokens: int, experts: int, top_k: int, dtype, device, gen, skew: float | None = None):
    """(topk_ids int64, topk_weights in dtype) as a softmax -> top-k -> renormalise router picks
    them (Mixtral's), from random logits with a seeded expert popularity (skew: routing_skew())."""
    skew = routing_skew() if skew is None else skew
    ranks = torch.randperm(experts, generator=gen, device=device).to(torch.float32) + 1
    spread = math.log(8) / math.log(experts) if experts > 1 else 0.0
    logits = torch.randn((tokens, experts), generator=gen, device=device) - skew * spread * ranks.log()
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return ids, (weights / weights.sum(-1, keepdim=True)).to(dtype)


def moe_experts_inputs(sig, dims, device, gen):
    experts, top_k, hidden, inter, ep = (sig.dim(n) for n in ("experts", "top_k", "hidden", "inter", "ep"))
    x = randn((dims["tokens"], hidden), sig, device, gen)
    ids, weights = routing(dims["tokens"], experts * ep, top_k, DTYPES[sig.dtype], device, gen)
    if ep > 1:
        ids, weights = rank_slots(ids, weights, experts)
    gate_up = expert_weight(experts, 2 * inter, hidden, sig, device, gen)
    down = expert_weight(experts, hidden, inter, sig, device, gen)
    args = (x, ids, weights, gate_up, down)
    if not ({"interleaved", "bias"} & sig.flags or sig.dim("limit") or ep > 1):
        return args
    biases = (randn((experts, 2 * inter), sig, device, gen, scale=0.1), randn((experts, hidden), sig, device, gen,
                                                                               scale=0.1)) \
        if "bias" in sig.flags else (None, None)
    return (*args, *biases, "interleaved" in sig.flags, sig.dim("alpha"), sig.dim("limit"), ep)


def rank_slots(ids, weights, experts: int):
    """A rank's view of a routing over every rank's experts, as transformers' expert parallelism
    hands it to the experts: its own experts (the first `experts` ids; popularity is drawn at
    random, so which rank is seen does not matter) keep their ids and weights, the other ranks'
    slots become the sentinel id `experts` with weight 0."""
    other = ids >= experts
    return ids.masked_fill(other, experts), weights.masked_fill(other, 0)


def expert_weight(experts: int, rows: int, cols: int, sig, device, gen):
    """(experts, rows, cols) scaled for unit outputs; with the transposed flag, a view of the
    weights stored (experts, cols, rows), as such models keep them."""
    if "transposed" in sig.flags:
        return randn((experts, cols, rows), sig, device, gen, scale=cols ** -0.5).transpose(1, 2)
    return randn((experts, rows, cols), sig, device, gen, scale=cols ** -0.5)


def distinct_logits(tokens: int, experts: int, sig, device, gen):
    """Router logits with no two equal in a row, in the signature's dtype: a tie would let two
    correct kernels pick different experts (bf16 logits of 128 experts tie often). Each row is
    drawn from the distinct values of the dtype in [-4, 4], which are log-spaced like a normal
    sample's magnitudes."""
    grid = _distinct_values(DTYPES[sig.dtype], experts).to(device)
    picks = torch.rand((tokens, grid.numel()), generator=gen, device=device).argsort(dim=-1)[:, :experts]
    return grid[picks]


@functools.cache
def _distinct_values(dtype, at_least: int) -> torch.Tensor:
    """The distinct values of `dtype` in [-4, 4] (on the CPU: the tuner also makes inputs on meta)."""
    steps = 8 * 1024
    while True:
        values = torch.linspace(-4, 4, steps).to(dtype).unique()
        if values.numel() >= at_least:
            return values
        steps *= 8


def moe_router_inputs(sig, dims, device, gen):
    return distinct_logits(dims["tokens"], sig.dim("experts"), sig, device, gen), sig.dim("top_k"), \
        "renorm" in sig.flags


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def expert_activation(h, interleaved: bool, alpha: float, limit: float):
    """The experts' gated activation of their gate_up rows h (..., 2 * inter): silu(gate) * up,
    or with a limit GPT-OSS's clamped SwiGLU (its _apply_gate); interleaved: gate and up columns
    in turn, else the gate half then the up half."""
    gate, up = (h[..., 0::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
    if not limit:
        return F.silu(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                alpha=0.0, limit=0.0, ep=1):
    """transformers' eager experts loop (MixtralExperts.forward): per expert hit, its tokens
    gathered, two GEMMs, the weighted rows added back. The loop and the index lists are
    data-dependent: one host sync per layer, and no CUDA graph. Under expert parallelism the
    sentinel id of other ranks' slots gets a class of its own, which no expert reads (as
    transformers does)."""
    out = torch.zeros_like(x)
    experts = gate_up.shape[0]
    with torch.no_grad():
        ids = topk_ids.clamp(max=experts) if ep > 1 else topk_ids
        mask = F.one_hot(ids, num_classes=experts + (ep > 1)).permute(2, 1, 0)[:experts]  # (expert, slot, token)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert in hit[:, 0].tolist():
        slots, tokens = torch.where(mask[expert])
        h = F.linear(x[tokens], gate_up[expert], None if gate_up_bias is None else gate_up_bias[expert])
        act = expert_activation(h, interleaved, alpha, limit)
        rows = F.linear(act, down[expert], None if down_bias is None else down_bias[expert])
        out.index_add_(0, tokens, (rows * topk_weights[tokens, slots, None]).to(out.dtype))
    return out


def moe_router(logits, top_k: int, renorm: bool):
    """As transformers' routers compute it: softmax in fp32, top-k, renormalised by the sum."""
    weights, ids = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float32), top_k, dim=-1)
    if renorm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


# --- the records ---------------------------------------------------------------------------------------
RECORDS = (
    # renorm: the top_k weights divided by their sum (Mixtral, Qwen3-MoE; GraniteMoE's softmax over the top_k)
    OpSchema("moe.router", ("experts", "top_k"), ("renorm",), ("tokens",), "eager.moe_router",
             method="moe_router", front=moe_router_front, call=moe_router_call, inputs=moe_router_inputs,
             fake=moe_router_fake),
    # experts: the experts this rank holds (all of them, or 1/ep under expert parallelism); inter:
    # each expert's intermediate width on this rank; interleaved: gate and up rows alternate;
    # bias: both projections biased; transposed: the weights are views of ones stored (experts,
    # in, out) (GPT-OSS), which kernels read in another order; limit, alpha: GPT-OSS's clamped
    # SwiGLU; ep: the ranks the experts are divided over (the routing spreads over experts * ep,
    # the other ranks' slots are sentinels)
    OpSchema("moe.experts", ("experts", "top_k", "hidden", "inter"), ("interleaved", "bias", "transposed"),
             ("tokens",), "torch.grouped_mm", (("alpha", 0.0), ("limit", 0.0), ("ep", 1)), method="moe_experts",
             front=moe_experts_front, call=moe_experts_call, inputs=moe_experts_inputs),
)


SPECS = [
    KernelSpec("eager.moe_experts", frozenset({"moe.experts"}), "torch", moe_experts, platforms=BOTH,
               dtypes=ALL_DTYPES, features=EXPERT_FORMS,
               notes="transformers' eager loop over the experts hit; index_add_ in the activation dtype"),
    KernelSpec("eager.moe_router", frozenset({"moe.router"}), "torch", moe_router, platforms=BOTH, dtypes=ALL_DTYPES,
               features=frozenset({"renorm"}), graph_safe=True, deterministic=True,
               notes="softmax in fp32, topk, a division: three or four launches"),
]
