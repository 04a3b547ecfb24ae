"""Example inputs of each op: random arguments of the canonical kernel call for a signature at
some dynamic dims. One definition serves the tuner (parity checks and timing, through
lzsolve.ops) and the runtime (Dispatcher.warmup, through runtime_loader.ops.example_args).

Each maker is (signature, dynamic dims, device, generator) -> the kernel's arguments. Inputs
look like a real model's (random, never zeros; trained norm weights near 1; gate and up as
halves of one buffer), so kernels are checked and timed on what they will serve.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os

import torch
import torch.nn.functional as F

from .dtypes import DTYPES

NORM_EPS = 1e-5
MAX_POSITIONS = 1024  # GPT-2's n_positions
TABLE_SCALE = 0.02  # GPT-2's init std: trained embedding rows are small
ROPE_THETA = 500000.0
ROPE_MAX_POSITION = 8192


def randn(shape, sig, device, gen, scale: float = 1.0) -> torch.Tensor:
    """Fresh normal samples in the signature's dtype (drawn in it directly: half the
    time of drawing fp32 and casting, which matters for CPU-sized lm_head weights)."""
    x = torch.randn(shape, generator=gen, device=device, dtype=DTYPES[sig.dtype])
    return x.mul_(scale) if scale != 1.0 else x


# --- attention ------------------------------------------------------------------------------------
def attention_shapes(sig, dims):
    """(batch, hq, hkv, d, seq_q, kv_len): a prefill has seq, a decode one query and kv_len keys."""
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    batch = dims["batch"]
    seq_q, kv_len = (dims["seq"], dims["seq"]) if "seq" in dims else (1, dims["kv_len"])
    return batch, hq, hkv, d, seq_q, kv_len


def attention(sig, dims, device, gen):
    """(q, k, v, causal, scale), with (window, softcap) appended only when the signature sets one,
    and sinks after them with the sinks flag (logits about as large as a short row's log-sum-exp,
    so they take a real share of the softmax)."""
    batch, hq, hkv, d, seq_q, kv_len = attention_shapes(sig, dims)
    q = randn((batch, hq, seq_q, d), sig, device, gen)
    k = randn((batch, hkv, kv_len, d), sig, device, gen)
    v = randn((batch, hkv, kv_len, d), sig, device, gen)
    options = (sig.dim("window"), sig.dim("softcap"))
    if "sinks" in sig.flags:
        return q, k, v, "causal" in sig.flags, None, *options, randn((hq,), sig, device, gen).add_(1.0)
    return (q, k, v, "causal" in sig.flags, None) + (options if any(options) else ())


def attention_fp8kv(sig, dims, device, gen):
    """A cache written as FP8 caches are: k and v divided by their scale into e4m3 (a fixed scale
    that maps N(0, 1) values well inside e4m3's range: no device sync to measure an amax)."""
    from .kernels.eager import E4M3_MAX  # the kernels import this module

    batch, hq, hkv, d, _, kv_len = attention_shapes(sig, dims)
    q = randn((batch, hq, 1, d), sig, device, gen)
    k_scale, v_scale = 1 / 64, 1 / 48

    def cached(scale):
        values = torch.randn((batch, hkv, kv_len, d), generator=gen, device=device) / scale
        return values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, cached(k_scale), cached(v_scale), k_scale, v_scale, None


# --- norms ------------------------------------------------------------------------------------------
def _norm_weight(sig, size, device, gen):
    """Trained norms scale by about 1: weight near 1, or near 0 under (1 + weight)."""
    weight = randn((size,), sig, device, gen, scale=0.1)
    return weight if "unit_offset" in sig.flags else weight + 1


def _rows(sig, dims, device, gen):
    return randn((dims["tokens"], sig.dim("hidden")), sig, device, gen)


def _unit_offset(sig) -> tuple:
    """unit_offset is appended to the call only when the signature sets it."""
    return (True,) if "unit_offset" in sig.flags else ()


def rms_norm(sig, dims, device, gen):
    return (_rows(sig, dims, device, gen), _norm_weight(sig, sig.dim("hidden"), device, gen), NORM_EPS) \
        + _unit_offset(sig)


def rms_norm_add(sig, dims, device, gen):
    """keep_inputs: the call then names unit_offset either way, as the op's front passes it."""
    tail = ("unit_offset" in sig.flags, True) if "keep_inputs" in sig.flags else _unit_offset(sig)
    return (_rows(sig, dims, device, gen), _rows(sig, dims, device, gen),
            _norm_weight(sig, sig.dim("hidden"), device, gen), NORM_EPS) + tail


def qk_norm(sig, dims, device, gen):
    heads, d = sig.dim("heads"), sig.dim("d")
    x = randn((dims["tokens"], heads, d), sig, device, gen)
    return (x, _norm_weight(sig, d, device, gen), NORM_EPS) + _unit_offset(sig)


def layer_norm(sig, dims, device, gen):
    bias = None if "no_bias" in sig.flags else randn((sig.dim("hidden"),), sig, device, gen, scale=0.1)
    return _rows(sig, dims, device, gen), _norm_weight(sig, sig.dim("hidden"), device, gen), bias, NORM_EPS


# --- positions and lookups -----------------------------------------------------------------------------
def cos_sin(positions: torch.Tensor, d: int, interleaved: bool, theta: float = ROPE_THETA):
    """(seq, d) cos and sin as Hugging Face lays them out for each pairing."""
    inv_freq = theta ** (-torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (seq, d/2)
    emb = angles.repeat_interleave(2, dim=-1) if interleaved else torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rope(sig, dims, device, gen):
    hq, hkv, d = sig.dim("hq"), sig.dim("hkv"), sig.dim("d")
    interleaved = sig.dim("layout") == "interleaved"
    seq = dims["tokens"]
    q = randn((1, hq, seq, d), sig, device, gen)
    k = randn((1, hkv, seq, d), sig, device, gen)
    positions = torch.randint(0, ROPE_MAX_POSITION, (seq,), generator=gen, device=device)
    cos, sin = cos_sin(positions, d, interleaved)
    dtype = DTYPES[sig.dtype]
    return q, k, cos[None].to(dtype), sin[None].to(dtype), interleaved


def embedding(sig, dims, device, gen):
    vocab, hidden = sig.dim("vocab"), sig.dim("hidden")
    ids = torch.randint(0, vocab, (dims["tokens"],), generator=gen, device=device)
    table = randn((vocab, hidden), sig, device, gen, scale=TABLE_SCALE)
    scale = hidden ** 0.5 if "scaled" in sig.flags else None
    return ids, table, scale


def learned_positions(sig, dims, device, gen):
    tokens, hidden = dims["tokens"], sig.dim("hidden")
    x = randn((tokens, hidden), sig, device, gen, scale=TABLE_SCALE)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen, device=device)
    return x, positions, randn((MAX_POSITIONS, hidden), sig, device, gen, scale=TABLE_SCALE)


# --- activations ----------------------------------------------------------------------------------------
def gated(sig, dims, device, gen):
    """Gate and up as the two halves of one (tokens, 2 * width) buffer, as a fused gate_up
    projection hands them over: kernels are checked and timed on those strided views."""
    width = sig.dim("width")
    gate_up = randn((dims["tokens"], 2 * width), sig, device, gen)
    return gate_up[:, :width], gate_up[:, width:]


def two_rows(sig, dims, device, gen):
    """Two separate (tokens, width) tensors (sigmoid_gate: the gate is split from q per head and
    reshaped, which copies it)."""
    width = sig.dim("width")
    return randn((dims["tokens"], width), sig, device, gen), randn((dims["tokens"], width), sig, device, gen)


def one_row(sig, dims, device, gen):
    return (randn((dims["tokens"], sig.dim("width")), sig, device, gen),)


# --- linear and recurrent ------------------------------------------------------------------------------------
def linear(sig, dims, device, gen):
    k, n = sig.dim("k"), sig.dim("n")
    x = randn((dims["tokens"], k), sig, device, gen)
    weight = randn((n, k), sig, device, gen, scale=k ** -0.5)  # keeps outputs O(1)
    bias = randn((n,), sig, device, gen) if "bias" in sig.flags else None
    return x, weight, bias


def linear_fp8(sig, dims, device, gen):
    """A bf16-like weight quantised as FP8 checkpoints store it: e4m3 with a scale per output
    channel (amax / 448) or one for the whole tensor."""
    from .kernels.eager import quantize_per_token  # the kernels import this module

    k, n = sig.dim("k"), sig.dim("n")
    x = randn((dims["tokens"], k), sig, device, gen)
    weight = torch.randn((n, k), generator=gen, device=device) * k ** -0.5
    quantized, scale = quantize_per_token(weight if "per_channel" in sig.flags else weight.reshape(1, -1))
    bias = randn((n,), sig, device, gen) if "bias" in sig.flags else None
    return x, quantized.reshape(n, k), scale.reshape(-1), bias


def linear_fp8_prequantised(sig, dims, device, gen):
    """linear_fp8's, x quantised per token as norm.rms_fp8 leaves it; the output dtype last."""
    from .dtypes import DTYPES
    from .kernels.eager import quantize_per_token

    x, weight, weight_scale, bias = linear_fp8(sig, dims, device, gen)
    return (*quantize_per_token(x), weight, weight_scale, bias, DTYPES[sig.dtype])


def starts_from_state(dims) -> bool:
    """A prompt's chunk starts from no state (seq > 1), a decode step (seq == 1) from one."""
    return dims["seq"] == 1


def causal_conv1d(sig, dims, device, gen):
    """x as a projection hands it over; weights of a conv1d's default init scale (1 / sqrt(width));
    a decode step's state holds the previous inputs (of x's scale)."""
    channels, width = sig.dim("channels"), sig.dim("width")
    batch, seq = dims["batch"], dims["seq"]
    x = randn((batch, seq, channels), sig, device, gen)
    weight = randn((channels, width), sig, device, gen, scale=width ** -0.5)
    bias = randn((channels,), sig, device, gen, scale=0.1) if "bias" in sig.flags else None
    state = randn((batch, channels, width), sig, device, gen) if starts_from_state(dims) else None
    return x, weight, bias, state, "silu" in sig.flags


def deltanet_gates(sig, dims, device, gen):
    """a and b as the columns of one projection output (in_proj_a and in_proj_b read the same
    input: patch runs them as one GEMM), A_log and dt_bias as Qwen3.5 initialises them."""
    heads, tokens = sig.dim("heads"), dims["tokens"]
    ab = randn((tokens, 2 * heads), sig, device, gen)
    a_log = torch.log(torch.rand((heads,), generator=gen, device=device) * 16 + 0.01).to(DTYPES[sig.dtype])
    dt_bias = (torch.rand((heads,), generator=gen, device=device) + 0.5).to(DTYPES[sig.dtype])
    return ab[:, :heads], ab[:, heads:], a_log, dt_bias


def gated_deltanet(sig, dims, device, gen):
    hk, hv, dk, dv = (sig.dim(n) for n in ("hk", "hv", "dk", "dv"))
    batch, seq = dims["batch"], dims["seq"]
    q = randn((batch, seq, hk, dk), sig, device, gen)
    k = randn((batch, seq, hk, dk), sig, device, gen)
    if "qk_l2norm" not in sig.flags:  # the caller normalised them: unit keys keep the state bounded
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = randn((batch, seq, hv, dv), sig, device, gen)
    # g: a log decay as Qwen3.5's -A * softplus(a + dt_bias) gives, in fp32, mostly small (decays near 1,
    # so the state carries far); beta = sigmoid(b) in the activation dtype
    g = -F.softplus(torch.randn((batch, seq, hv), generator=gen, device=device) - 2)
    beta = torch.sigmoid(randn((batch, seq, hv), sig, device, gen))
    state = None
    if starts_from_state(dims):  # an associative memory of unit keys: entries of about 1 / sqrt(dk)
        state = torch.randn((batch, hv, dk, dv), generator=gen, device=device) * dk ** -0.5
    return q, k, v, g, beta, state, "qk_l2norm" in sig.flags


# --- mixture of experts ---------------------------------------------------------------------------------
# Real routers load experts unevenly, and kernels react to it (the fullest expert sets a grouped
# GEMM's longest segment): the expert of popularity rank r gets a Zipf-like -s * log(r) on its
# router logit, scaled by log(8) / log(experts) so that the spread does not grow with the expert
# count. At s = 0.3 (4096 tokens) the fullest expert gets 1.6x the mean load of 8 experts (top 2),
# 2.4x of 128 (top 8) and 3.0x of 512 (top 10): trained routers with a balancing loss, roughly.
# `lzsolve tune --routing-skew S` measures at another skew (0: uniform): it sets SKEW_ENV, which
# its worker processes inherit, and records the skew with each moe.experts record.
ROUTING_SKEW = 0.3
SKEW_ENV = "LZSOLVE_ROUTING_SKEW"
ROUTED_OPS = ("moe.experts",)  # the ops whose inputs hold a routing


def routing_skew() -> float:
    """The skew routings are drawn with here: SKEW_ENV's when a tune set it, else ROUTING_SKEW."""
    return float(os.environ.get(SKEW_ENV, ROUTING_SKEW))


@contextlib.contextmanager
def skewed_routing(skew: float):
    """Routings drawn with `skew` inside, in this process and in the processes it starts."""
    before = os.environ.get(SKEW_ENV)
    os.environ[SKEW_ENV] = repr(float(skew))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SKEW_ENV, None)
        else:
            os.environ[SKEW_ENV] = before


def routing(tokens: int, experts: int, top_k: int, dtype, device, gen, skew: float | None = None):
    """(topk_ids int64, topk_weights in dtype) as a softmax -> top-k -> renormalise router picks
    them (Mixtral's), from random logits with a seeded expert popularity (skew: routing_skew())."""
    skew = routing_skew() if skew is None else skew
    ranks = torch.randperm(experts, generator=gen, device=device).to(torch.float32) + 1
    spread = math.log(8) / math.log(experts) if experts > 1 else 0.0
    logits = torch.randn((tokens, experts), generator=gen, device=device) - skew * spread * ranks.log()
    weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return ids, (weights / weights.sum(-1, keepdim=True)).to(dtype)


def moe_experts(sig, dims, device, gen):
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


@functools.lru_cache(maxsize=None)
def _distinct_values(dtype, at_least: int) -> torch.Tensor:
    """The distinct values of `dtype` in [-4, 4] (on the CPU: the tuner also makes inputs on meta)."""
    steps = 8 * 1024
    while True:
        values = torch.linspace(-4, 4, steps).to(dtype).unique()
        if values.numel() >= at_least:
            return values
        steps *= 8


def moe_router(sig, dims, device, gen):
    return distinct_logits(dims["tokens"], sig.dim("experts"), sig, device, gen), sig.dim("top_k"), \
        "renorm" in sig.flags
