"""The attention family's oracles: a signature or more per op (with dynamic dims) and an
independent float64 formula per op (attention: textbook attention per (batch, head)), which tests/test_ops.py checks each
contract's reference against."""
import math

import torch

from runtime_loader.ops import Signature

SIGS = [
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16}, ("causal",), "fp32"), {"batch": 2, "seq": 7}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 4, "d": 16}, (), "fp32"), {"batch": 1, "seq": 5}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "window": 3}, ("causal",), "fp32"),
     {"batch": 2, "seq": 9}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "softcap": 1.5}, ("causal", "qk_norm"), "fp32"),
     {"batch": 1, "seq": 6}),
    (Signature.make("attention.prefill", {"hq": 2, "hkv": 2, "d": 8, "window": 2, "softcap": 1.0}, (), "fp32"),
     {"batch": 1, "seq": 6}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8}, (), "fp32"), {"batch": 3, "kv_len": 9}),
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 16, "window": 3}, ("causal", "sinks"), "fp32"),
     {"batch": 2, "seq": 7}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8}, ("sinks",), "fp32"), {"batch": 3, "kv_len": 9}),
    (Signature.make("attention.decode", {"hq": 6, "hkv": 2, "d": 8, "window": 4, "softcap": 2.0}, (), "fp32"),
     {"batch": 2, "kv_len": 9}),
    (Signature.make("attention.decode_fp8kv", {"hq": 6, "hkv": 2, "d": 8}, (), "bf16"), {"batch": 2, "kv_len": 9}),
    # MLA: v's head dim other than q's and k's
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 2, "d": 12, "dv": 8}, ("causal",), "fp32"),
     {"batch": 2, "seq": 7}),
    (Signature.make("attention.decode", {"hq": 4, "hkv": 4, "d": 12, "dv": 8}, (), "fp32"), {"batch": 2, "kv_len": 9}),
    # BLOOM's ALiBi: power-of-two and other head counts
    (Signature.make("attention.prefill", {"hq": 4, "hkv": 4, "d": 8}, ("causal", "alibi"), "fp32"),
     {"batch": 2, "seq": 7}),
    (Signature.make("attention.prefill", {"hq": 6, "hkv": 6, "d": 8}, ("causal", "alibi"), "fp32"),
     {"batch": 1, "seq": 6}),
    (Signature.make("attention.decode", {"hq": 5, "hkv": 5, "d": 8}, ("alibi",), "fp32"), {"batch": 2, "kv_len": 9}),
    (Signature.make("attention.mla_decode", {"hq": 3, "rank": 12, "rope": 4}, (), "fp32"), {"batch": 2, "kv_len": 9}),
]


def alibi_slopes64(heads):
    """The ALiBi paper's slopes (Press et al., as BLOOM's code): the geometric sequence starting at
    2^(-8/n) with that ratio for n a power of two; else that of the largest power of two below,
    then every other term of the sequence of twice that power."""
    def geometric(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(heads).is_integer():
        return geometric(heads)
    closest = 2 ** int(math.log2(heads))
    return geometric(closest) + geometric(2 * closest)[0::2][:heads - closest]


def attention64(q, k, v, causal, scale, window=0, softcap=0.0, sinks=None, alibi=False):
    """Textbook attention, one (batch, head) at a time, in float64; masks as -inf triangles, the
    window's diagonal moved to the query's position (i, or kv_len - 1 for a decode query); a
    sink adds exp(sink) to each row's denominator; ALiBi adds slope * key index, as BLOOM does;
    the output has v's head dim."""
    q, k, v = q.double(), k.double(), v.double()
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    groups = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    offset = 0 if causal else k.shape[2] - q.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h] @ k[b, h // groups].T * scale
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            if alibi:
                s = s + alibi_slopes64(q.shape[1])[h] * torch.arange(k.shape[2], dtype=torch.float64)
            if causal:
                s = s + torch.full_like(s, -math.inf).triu(1)
            if window:
                s = s + torch.full_like(s, -math.inf).tril(offset - window)
            weights = torch.exp(s - s.max(-1, keepdim=True).values)
            total = weights.sum(-1, keepdim=True)
            if sinks is not None:
                total = total + torch.exp(sinks[h].double() - s.max(-1, keepdim=True).values)
            out[b, h] = weights / total @ v[b, h // groups]
    return out


def mla_decode64(q_nope, q_pe, kv, k_pe, scale):
    """MLA's absorbed decode as the attention it stands for: one kv head whose keys are the latent
    and k's RoPE part side by side and whose values are the latent, every q head reading it."""
    q = torch.cat([q_nope, q_pe], dim=-1)
    k = torch.cat([kv, k_pe], dim=-1)
    return attention64(q, k, kv, False, scale)


INDEPENDENT = {
    "attention.prefill": attention64,
    "attention.decode": attention64,
    "attention.decode_fp8kv": lambda q, k, v, k_scale, v_scale, scale: attention64(
        q, k.double() * k_scale, v.double() * v_scale, False, scale),
    "attention.mla_decode": mla_decode64,
}
