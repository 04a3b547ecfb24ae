"""The walker: a (sharded) model becomes the op instances one forward pass runs."""
from __future__ import annotations

from dataclasses import dataclass

from runtime_loader.ops import Signature

from .spec import ModelSpec


@dataclass(frozen=True)
class OpInstance:
    signature: Signature
    roles: tuple[str, ...]  # where the model calls it: "layers.*.attn.qkv_proj", "lm_head"
    calls_per_forward: int


def _llama_block(spec: ModelSpec) -> list[tuple[str, dict, tuple, str, int]]:
    """(op, static dims, flags, role, calls per forward) for a Llama-style model.

    Every norm but the first adds the residual stream first: servers fuse that add into the
    norm (norm.rms_add), so it is tuned as one op."""
    hidden, hq, hkv, d, layers = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.layers
    attn_bias = ("bias",) if spec.attention_bias else ()
    mlp_bias = ("bias",) if spec.mlp_bias else ()
    heads = {"hq": hq, "hkv": hkv, "d": d}
    return [
        ("norm.rms", {"hidden": hidden}, (), "layers.0.input_norm", 1),
        ("norm.rms_add", {"hidden": hidden}, (), "layers.*.input_norm", layers - 1),
        ("linear", {"k": hidden, "n": (hq + 2 * hkv) * d}, attn_bias, "layers.*.attn.qkv_proj", layers),
        ("posenc.rope", {**heads, "layout": "split_half"}, (), "layers.*.attn.rope", layers),
        ("attention.prefill", heads, ("causal",), "layers.*.attn.prefill", layers),
        ("attention.decode", heads, (), "layers.*.attn.decode", layers),
        ("linear", {"k": hq * d, "n": hidden}, attn_bias, "layers.*.attn.o_proj", layers),
        ("norm.rms_add", {"hidden": hidden}, (), "layers.*.post_attention_norm", layers),
        ("linear", {"k": hidden, "n": 2 * spec.intermediate}, mlp_bias, "layers.*.mlp.gate_up_proj", layers),
        ("act.swiglu", {"width": spec.intermediate}, (), "layers.*.mlp.act", layers),
        ("linear", {"k": spec.intermediate, "n": hidden}, mlp_bias, "layers.*.mlp.down_proj", layers),
        ("norm.rms_add", {"hidden": hidden}, (), "final_norm", 1),
        ("linear", {"k": hidden, "n": spec.vocab}, (), "lm_head", 1),
    ]


def walk(spec: ModelSpec, dtype: str) -> list[OpInstance]:
    """One OpInstance per distinct op signature, in the order the forward pass meets them."""
    merged: dict[Signature, tuple[list[str], int]] = {}
    for op, static, flags, role, calls in _llama_block(spec):
        if calls == 0:  # a one-layer model has no layers.* input norm with a residual
            continue
        sig = Signature.make(op, static, flags, dtype)
        roles, count = merged.get(sig, ([], 0))
        merged[sig] = (roles + [role], count + calls)
    return [OpInstance(sig, tuple(roles), count) for sig, (roles, count) in merged.items()]
