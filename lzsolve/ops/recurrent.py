"""recurrent.gated_deltanet: Qwen3.5's Gated DeltaNet core (the linear-attention layers), and
recurrent.deltanet_gates, the per-head gates computed before it (see gates_reference).

Canonical call gated_deltanet(q, k, v, g, beta, state, qk_l2norm) with q, k (batch, seq, hk, dk),
v (batch, seq, hv, dv), g (batch, seq, hv) the log decay (<= 0, fp32 as the model computes it),
beta (batch, seq, hv) in (0, 1), state (batch, hv, dk, dv) fp32 or None (zeros). Returns
(out (batch, seq, hv, dv) in v's dtype, final state (batch, hv, dk, dv) fp32).
Each q/k head serves hv // hk consecutive value heads; with qk_l2norm, q and k are L2-normalised
over dk first (eps 1e-6 inside the rsqrt, as FLA); q is always scaled by dk ** -0.5. Per value
head and token: S <- exp(g) S, then the delta rule S <- S + k (beta (v - S^T k))^T (the state
learns to map k to v), and out = S^T q.
Inputs: a prompt's chunk starts from no state (seq > 1), a decode step (seq == 1) from one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lzsolve.ops.base import OpContract, itemsize
from runtime_loader.inputs import starts_from_state as _starts_from_state


def reference(q, k, v, g, beta, state, qk_l2norm):
    """The recurrence in fp32 over (batch * hv) independent heads, one token at a time, with the
    state update as a rank-1 correction: S' = exp(g) S; S = S' + beta k (v - S'^T k)^T."""
    batch, seq, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    q, k = (t.repeat_interleave(hv // hk, dim=2) for t in (q, k))
    if qk_l2norm:
        q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    q = q / dk ** 0.5

    def heads(t):  # (batch, seq, hv, ...) -> (seq, batch * hv, ...)
        return t.transpose(0, 1).reshape(seq, batch * hv, *t.shape[3:])

    q, k, v, decay, beta = heads(q), heads(k), heads(v), heads(g).exp(), heads(beta)
    s = torch.zeros(batch * hv, dk, dv, device=v.device) if state is None else state.reshape(batch * hv, dk, dv)
    out = torch.empty(seq, batch * hv, dv, device=v.device)
    for t in range(seq):
        s = s * decay[t, :, None, None]
        error = v[t] - torch.bmm(k[t][:, None, :], s)[:, 0]  # what the memory mispredicts for k
        s = s + torch.bmm(k[t][:, :, None], (beta[t, :, None] * error)[:, None, :])
        out[t] = torch.bmm(q[t][:, None, :], s)[:, 0]
    return out.reshape(seq, batch, hv, dv).transpose(0, 1), s.reshape(batch, hv, dk, dv)


def flops(sig, dims):
    """Per token and value head: decay, read, correct and query the (dk, dv) state, ~7 dk dv."""
    return 7.0 * dims["batch"] * dims["seq"] * sig.dim("hv") * sig.dim("dk") * sig.dim("dv")


def bytes_moved(sig, dims):
    """q, k, v, out in the activation dtype; g (fp32) and beta; the fp32 state written (and read
    when the call starts from one)."""
    hk, hv, dk, dv = (sig.dim(n) for n in ("hk", "hv", "dk", "dv"))
    tokens = dims["batch"] * dims["seq"]
    activations = itemsize(sig) * tokens * (2 * hk * dk + 2 * hv * dv + hv) + 4 * tokens * hv
    state = 4 * dims["batch"] * hv * dk * dv * (2 if _starts_from_state(dims) else 1)
    return float(activations + state)


# prefill from no state (GQA-like hv > hk), a decode step from a state, and q, k normalised by the caller
CASES = (({"hk": 2, "hv": 4, "dk": 64, "dv": 32}, ("qk_l2norm",), {"batch": 2, "seq": 33}),
         ({"hk": 2, "hv": 2, "dk": 128, "dv": 64}, ("qk_l2norm",), {"batch": 3, "seq": 1}),
         ({"hk": 1, "hv": 2, "dk": 32, "dv": 32}, (), {"batch": 1, "seq": 20}))
GATED_DELTANET = OpContract("recurrent.gated_deltanet", reference, flops, bytes_moved, CASES)


# --- the decay and write-strength gates that feed it -------------------------------------------------
def gates_reference(a, b, a_log, dt_bias):
    """Qwen3.5's gates per token and value head, in fp32: g = -exp(A_log) * softplus(a + dt_bias)
    (the log decay), beta = sigmoid(b) (how strongly the token is written)."""
    return -a_log.exp() * F.softplus(a + dt_bias), torch.sigmoid(b)


def gates_flops(sig, dims):
    """softplus (exp, log1p), the scale and the sigmoid: ~10 per token and head."""
    return 10.0 * dims["tokens"] * sig.dim("heads")


def gates_bytes(sig, dims):
    """a and b read, beta written in the activation dtype; g written in fp32; A_log and dt_bias
    (heads,) read once."""
    return float(dims["tokens"] * sig.dim("heads") * (3 * itemsize(sig) + 4) + 2 * itemsize(sig) * sig.dim("heads"))


# a few tokens of an odd head count; a decode batch of Qwen3.5-0.8B's 16 value heads
DELTANET_GATES = OpContract("recurrent.deltanet_gates", gates_reference, gates_flops, gates_bytes,
                            (({"heads": 6}, (), {"tokens": 5}), ({"heads": 16}, (), {"tokens": 3})))

CONTRACTS = (DELTANET_GATES, GATED_DELTANET)
