"""The recurrent family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (the delta rule as a matrix recurrence), which tests/test_ops.py checks each
contract's reference against."""
import math

import torch

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("recurrent.deltanet_gates", {"heads": 5}, (), "fp32"), {"tokens": 4}),
    (Signature.make("recurrent.deltanet_gates", {"heads": 16}, (), "bf16"), {"tokens": 2}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 1, "hv": 2, "dk": 8, "dv": 4}, ("qk_l2norm",), "fp32"),
     {"batch": 2, "seq": 6}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 2, "hv": 2, "dk": 8, "dv": 8}, ("qk_l2norm",), "fp32"),
     {"batch": 2, "seq": 1}),
    (Signature.make("recurrent.gated_deltanet", {"hk": 2, "hv": 4, "dk": 4, "dv": 8}, (), "fp32"),
     {"batch": 1, "seq": 5}),
]


def deltanet64(q, k, v, g, beta, state, qk_l2norm):
    """The gated delta rule per (batch, value head) in float64, with the state update as the
    matrix product S <- (I - beta k k^T) exp(g) S + beta k v^T."""
    batch, seq, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    out = torch.empty(batch, seq, hv, dv, dtype=torch.float64)
    final = torch.empty(batch, hv, dk, dv, dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for b in range(batch):
        for h in range(hv):
            s = torch.zeros(dk, dv, dtype=torch.float64) if state is None else state[b, h].double()
            for t in range(seq):
                qt, kt = q[b, t, h * hk // hv].double(), k[b, t, h * hk // hv].double()
                if qk_l2norm:
                    qt, kt = qt / torch.sqrt((qt ** 2).sum() + 1e-6), kt / torch.sqrt((kt ** 2).sum() + 1e-6)
                bt = beta[b, t, h].double()
                decayed = math.exp(g[b, t, h]) * s
                s = (eye - bt * torch.outer(kt, kt)) @ decayed + bt * torch.outer(kt, v[b, t, h].double())
                out[b, t, h] = s.T @ qt / math.sqrt(dk)
            final[b, h] = s
    return out, final


INDEPENDENT = {
    # -A times softplus written as log(1 + e^x); the sigmoid as 1 / (1 + e^-x)
    "recurrent.deltanet_gates": lambda a, b, a_log, dt: (-torch.exp(a_log.double()) * torch.log1p(
        torch.exp(a.double() + dt.double())), 1 / (1 + torch.exp(-b.double()))),
    "recurrent.gated_deltanet": deltanet64,
}
