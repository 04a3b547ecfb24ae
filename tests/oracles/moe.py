"""The moe family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (experts token by token, the router by a full sort), which tests/test_ops.py checks each
contract's reference against."""
import torch

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("moe.experts", {"experts": 6, "top_k": 2, "hidden": 16, "inter": 12}, (), "fp32"), {"tokens": 9}),
    (Signature.make("moe.experts", {"experts": 5, "top_k": 2, "hidden": 16, "inter": 12, "alpha": 1.702, "limit": 0.4},
                    ("interleaved", "bias", "transposed"), "fp32"), {"tokens": 7}),
    (Signature.make("moe.experts", {"experts": 4, "top_k": 2, "hidden": 16, "inter": 12, "ep": 2}, (), "fp32"),
     {"tokens": 9}),
    (Signature.make("moe.router", {"experts": 12, "top_k": 3}, ("renorm",), "fp32"), {"tokens": 6}),
    (Signature.make("moe.router", {"experts": 12, "top_k": 3}, (), "bf16"), {"tokens": 6}),
]


def moe64(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
          alpha=0.0, limit=0.0, ep=1):
    """Token by token, slot by slot: the weighted sum of its experts' gated MLPs, in float64; a slot
    of another rank's expert (an id past this rank's) adds nothing."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = down.shape[2]
    for t in range(x.shape[0]):
        for slot in range(topk_ids.shape[1]):
            e = topk_ids[t, slot]
            if e >= gate_up.shape[0]:
                continue
            h = gate_up[e].double() @ x[t].double() + (0 if gate_up_bias is None else gate_up_bias[e].double())
            gate, up = (h[0::2], h[1::2]) if interleaved else (h[:inter], h[inter:])
            if limit:  # GPT-OSS: gate clamped from above, up both ways, (up + 1)
                gate, up, scale = torch.minimum(gate, torch.tensor(limit)), up.clamp(-limit, limit) + 1, alpha
            else:
                scale = 1.0
            y = down[e].double() @ (gate / (1 + torch.exp(-scale * gate)) * up)
            out[t] += topk_weights[t, slot].double() * (y + (0 if down_bias is None else down_bias[e].double()))
    return out


def router64(logits, top_k, renorm):
    """Row by row: exp / sum in float64, the top_k by a full descending sort."""
    weights, ids = [], []
    for row in logits.double():
        probs = torch.exp(row - row.max()) / torch.exp(row - row.max()).sum()
        order = sorted(range(len(row)), key=lambda e: -probs[e].item())[:top_k]
        picked = probs[order]
        weights.append(picked / picked.sum() if renorm else picked)
        ids.append(torch.tensor(order))
    return torch.stack(weights), torch.stack(ids)


INDEPENDENT = {
    "moe.experts": moe64,
    "moe.router": router64,
}
