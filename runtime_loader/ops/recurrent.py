"""Qwen3.5's linear attention: the Gated DeltaNet's gates and its recurrence. Their records, how a
call is read, example inputs and eager kernels (as transformers computes them without FLA).
Contract: lzsolve.ops.recurrent.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dtypes import ALL_DTYPES, DTYPE_NAMES, DTYPES
from ..inputs import randn, starts_from_state
from ..specs import BOTH, KernelSpec
from .base import OpSchema, Signature


def deltanet_gates_front(a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor):
    """Qwen3.5's Gated DeltaNet gates from the a and b projections (..., heads): (g = -exp(a_log)
    * softplus(a + dt_bias) in fp32, beta = sigmoid(b) in b's dtype)."""
    return (a.shape, a.stride(), b.stride(), a.dtype, a.is_cuda), (a, b, a_log, dt_bias)


def deltanet_gates_call(a, b, a_log=None, dt_bias=None):
    if a.dim() == 0 or a.shape != b.shape or a.dtype not in DTYPE_NAMES:
        return None
    heads = a.shape[-1]
    return (Signature.make("recurrent.deltanet_gates", {"heads": heads}, (), DTYPE_NAMES[a.dtype]),
            {"tokens": a.numel() // max(heads, 1)})


def deltanet_gates_fake(a: Tensor, b: Tensor, *args) -> tuple[Tensor, Tensor]:
    return a.new_empty(a.shape, dtype=torch.float32), torch.empty_like(b)


def gated_deltanet_front(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None,
                         qk_l2norm: bool = True):
    """Qwen3.5's Gated DeltaNet: q, k (batch, seq, hk, dk), v (batch, seq, hv, dv), g (log
    decay) and beta (batch, seq, hv), state (batch, hv, dk, dv) or None; returns (out, final
    fp32 state). See lzsolve.ops.recurrent for the conventions."""
    return (q.shape, v.shape, q.dtype, q.is_cuda, qk_l2norm), (q, k, v, g, beta, state, qk_l2norm)


def gated_deltanet_call(q, k, v, g=None, beta=None, state=None, qk_l2norm=True):
    """q: (batch, seq, hk, dk), v: (batch, seq, hv, dv); k has q's shape."""
    if q.dim() != 4 or v.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, seq, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    flags = ("qk_l2norm",) if qk_l2norm else ()
    static = {"hk": hk, "hv": hv, "dk": dk, "dv": dv}
    return (Signature.make("recurrent.gated_deltanet", static, flags, DTYPE_NAMES[q.dtype]),
            {"batch": batch, "seq": seq})


def gated_deltanet_fake(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *args) -> tuple[Tensor, Tensor]:
    batch, seq, hv, dv = v.shape
    return v.new_empty(v.shape), v.new_empty((batch, hv, q.shape[-1], dv), dtype=torch.float32)


# --- example inputs ---------------------------------------------------------------------------------
def deltanet_gates_inputs(sig, dims, device, gen):
    """a and b as the columns of one projection output (in_proj_a and in_proj_b read the same
    input: patch runs them as one GEMM), A_log and dt_bias as Qwen3.5 initialises them."""
    heads, tokens = sig.dim("heads"), dims["tokens"]
    ab = randn((tokens, 2 * heads), sig, device, gen)
    a_log = torch.log(torch.rand((heads,), generator=gen, device=device) * 16 + 0.01).to(DTYPES[sig.dtype])
    dt_bias = (torch.rand((heads,), generator=gen, device=device) + 0.5).to(DTYPES[sig.dtype])
    return ab[:, :heads], ab[:, heads:], a_log, dt_bias


def gated_deltanet_inputs(sig, dims, device, gen):
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


# --- the eager kernels: the fallbacks, written as transformers computes these ops ------------------
def deltanet_gates(a, b, a_log, dt_bias):
    """As Qwen3.5's forward computes them: beta = sigmoid(b) in b's dtype, the log decay in fp32."""
    return -a_log.float().exp() * F.softplus(a.float() + dt_bias), b.sigmoid()


def l2_normalize(x, eps: float = 1e-6):
    """As FLA and transformers normalise Gated DeltaNet's q and k: eps inside the rsqrt."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _deltanet_heads(q, k, v, qk_l2norm: bool):
    """q and k per value head in fp32 (each q/k head serves hv // hk consecutive value heads),
    L2-normalised if asked, q scaled by dk ** -0.5; v in fp32."""
    hk, dk, hv = k.shape[2], k.shape[3], v.shape[2]
    if hv != hk:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k = q.float(), k.float()
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q * dk ** -0.5, k, v.float()


def gated_deltanet_recurrent(q, k, v, g, beta, state, qk_l2norm: bool):
    """The gated delta rule one token at a time, in fp32 (transformers' torch_recurrent_gated_delta_rule).
    q, k: (batch, seq, hk, dk); v: (batch, seq, hv, dv); g (log decay), beta: (batch, seq, hv);
    state: (batch, hv, dk, dv) or None. Per value head and token: S <- exp(g) S, then the delta
    rule S <- S + k (beta (v - S^T k))^T, and out = S^T q / sqrt(dk).
    Returns (out in v's dtype, final state in fp32)."""
    batch, seq, hv, dv = v.shape
    dk = k.shape[3]
    q, k, values = _deltanet_heads(q, k, v, qk_l2norm)
    decay, beta = g.float().exp(), beta.float()
    state = torch.zeros(batch, hv, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty(batch, seq, hv, dv, dtype=torch.float32, device=v.device)
    for t in range(seq):
        state = state * decay[:, t, :, None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, t])
        delta = (values[:, t] - predicted) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, t])
    return out.to(v.dtype), state


DELTANET_CHUNK = 64


def gated_deltanet_chunked(q, k, v, g, beta, state, qk_l2norm: bool, chunk: int = DELTANET_CHUNK):
    """The same rule over chunks of `chunk` tokens, in fp32 (transformers' torch_chunk_gated_delta_rule,
    the "WY" form of the DeltaNet papers): within a chunk the delta updates are one unit lower
    triangular solve, so the sequential part is one state step per chunk, not per token."""
    batch, seq, hv, dv = v.shape
    dk = k.shape[3]
    q, k, values = _deltanet_heads(q, k, v, qk_l2norm)
    pad = -seq % chunk  # zero tokens at the end: beta 0 writes nothing, g 0 decays nothing
    count = (seq + pad) // chunk  # named, not -1 in the reshapes: a reshape of 0 elements (batch 0) cannot infer it

    def chunks(t):  # (batch, seq, hv, ...) -> (batch, hv, chunks, chunk, ...)
        t = t.transpose(1, 2)
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
        return t.reshape(batch, hv, count, chunk, *t.shape[3:])

    q, k, values, beta, log_decay = (chunks(t) for t in (q, k, values, beta.float(), g.float()))
    decay = log_decay.cumsum(-1)  # log of the decay from the chunk's start to each token
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    between = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf")).exp()
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * between  # the strictly lower part couples a chunk's updates
    new_values = torch.linalg.solve_triangular(system, values * beta[..., None], upper=False, unitriangular=True)
    k_decayed = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False,
                                              unitriangular=True)
    within = (q @ k.transpose(-1, -2)) * between
    q = q * decay.exp()[..., None]
    k = k * (decay[..., -1:] - decay).exp()[..., None]
    chunk_decay = decay[..., -1].exp()[..., None, None]
    state = torch.zeros(batch, hv, dk, dv, dtype=torch.float32, device=v.device) if state is None else state.float()
    out = torch.empty_like(new_values)
    for c in range(q.shape[2]):
        corrected = new_values[:, :, c] - k_decayed[:, :, c] @ state  # what the state does not predict yet
        out[:, :, c] = q[:, :, c] @ state + within[:, :, c] @ corrected
        state = state * chunk_decay[:, :, c] + k[:, :, c].transpose(-1, -2) @ corrected
    out = out.reshape(batch, hv, count * chunk, dv)[:, :, :seq].transpose(1, 2)
    return out.to(v.dtype), state


def gated_deltanet(q, k, v, g, beta, state, qk_l2norm: bool):
    """As transformers' Qwen3.5 runs it without FLA: a decode step token by token, anything
    longer chunked. Returns (out in v's dtype, final state in fp32)."""
    rule = gated_deltanet_recurrent if q.shape[1] == 1 else gated_deltanet_chunked
    return rule(q, k, v, g, beta, state, qk_l2norm)


# --- the records ---------------------------------------------------------------------------------------
# the tuner's buckets per named grid (lzsolve.measure.grid); seq 1: a decode step on the state
SEQUENCE_BUCKETS = {"tiny": {"batch": (1,), "seq": (1, 16)}, "small": {"batch": (1, 8), "seq": (1, 64)},
                    "full": {"batch": (1, 8, 32), "seq": (1, 512, 2048)}}
RECORDS = (
    # its gates per token and value head (heads: value heads)
    OpSchema("recurrent.deltanet_gates", ("heads",), (), ("tokens",), "eager.deltanet_gates",
             method="deltanet_gates", front=deltanet_gates_front, call=deltanet_gates_call,
             inputs=deltanet_gates_inputs, fake=deltanet_gates_fake),
    # Gated DeltaNet (Qwen3.5's linear attention): hk key heads, hv value heads (hv % hk == 0)
    OpSchema("recurrent.gated_deltanet", ("hk", "hv", "dk", "dv"), ("qk_l2norm",), ("batch", "seq"),
             "eager.gated_deltanet", method="gated_deltanet", front=gated_deltanet_front, call=gated_deltanet_call,
             inputs=gated_deltanet_inputs, fake=gated_deltanet_fake,
             buckets=SEQUENCE_BUCKETS),
)


SPECS = [
    KernelSpec("eager.deltanet_gates", frozenset({"recurrent.deltanet_gates"}), "torch", deltanet_gates,
               platforms=BOTH, dtypes=ALL_DTYPES, graph_safe=True, deterministic=True,
               notes="as the model's forward: six elementwise launches"),
    KernelSpec("eager.gated_deltanet", frozenset({"recurrent.gated_deltanet"}), "torch", gated_deltanet,
               platforms=BOTH, dtypes=ALL_DTYPES, features=frozenset({"gqa", "qk_l2norm"}), graph_safe=True,
               deterministic=True, notes="as transformers computes it without FLA: chunks of 64 tokens in fp32 (a "
                                         "triangular solve per chunk, a Python loop over chunks); decode token by token"),
]
