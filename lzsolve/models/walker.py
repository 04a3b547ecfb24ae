"""The walker: a (sharded) model becomes the op instances one forward pass runs.

Every model is a token embedding, a stack of pre-norm residual layers (a token mixer, then
an MLP) and a final norm before the lm_head. Families differ in the mixer (softmax attention
over all keys or a sliding window, or Gated DeltaNet linear attention), in the norms and in
the MLP; ModelSpec.block says which. Projections are walked fused (q/k/v into one linear,
gate/up into one) as serving engines run them. What a model computes that no op covers is
listed by `unmodelled`, never dropped silently.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from runtime_loader.ops import Signature, required_features as signature_features

from .spec import FULL, LINEAR, SLIDING, ModelSpec

# the role prefix of each layer type's mixer
MIXER_ROLES = {FULL: "layers.*.attn", SLIDING: "layers.*.sliding_attn", LINEAR: "layers.*.linear_attn"}

Row = tuple[str, dict, tuple, str, int]  # (op, static dims, flags, role, calls per forward)


@dataclass(frozen=True)
class OpInstance:
    signature: Signature
    roles: tuple[str, ...]  # where the model calls it: "layers.*.attn.qkv_proj", "lm_head"
    calls_per_forward: int


def _flag(name: str, on: bool) -> tuple[str, ...]:
    return (name,) if on else ()


def _norm(spec: ModelSpec, role: str, calls: int, adds_residual: bool) -> Row:
    """A norm of the residual stream. One that adds the residual stream first is tuned fused
    with that add (norm.rms_add), as servers run it; LayerNorm has no fused form here (its
    adds are listed by `unmodelled`)."""
    if spec.block.norm == "norm.layer":
        return ("norm.layer", {"hidden": spec.hidden}, (), role, calls)
    op = "norm.rms_add" if adds_residual else "norm.rms"
    return (op, {"hidden": spec.hidden}, _flag("unit_offset", spec.block.unit_offset), role, calls)


def _attention_rows(spec: ModelSpec, kind: str, calls: int) -> list[Row]:
    """Softmax attention: qkv projection, per-head q/k norms, RoPE, attention (prefill and
    decode), output gate, o projection."""
    role, block = MIXER_ROLES[kind], spec.block
    hq, hkv, d = spec.heads, spec.kv_heads, spec.head_dim
    heads = {"hq": hq, "hkv": hkv, "d": d}
    # a window only on sliding layers; window and softcap are left out of signatures when 0
    scores = {**heads, "window": spec.window if kind == SLIDING else 0, "softcap": spec.attn_softcap}
    qk_norm = _flag("qk_norm", block.qk_norm)
    norm_flags = _flag("unit_offset", block.unit_offset)
    q_width = 2 * hq * d if block.output_gate else hq * d  # q_proj also makes the output gate
    rows = [("linear", {"k": spec.hidden, "n": q_width + 2 * hkv * d}, _flag("bias", spec.qkv_bias),
             f"{role}.qkv_proj", calls)]
    if block.qk_norm:
        rows += [("norm.qk", {"heads": hq, "d": d}, norm_flags, f"{role}.q_norm", calls),
                 ("norm.qk", {"heads": hkv, "d": d}, norm_flags, f"{role}.k_norm", calls)]
    if spec.rotary_dim:
        # partial RoPE rotates the first rotary_dim dims of each head; theta (which differs
        # between sliding and full layers in Gemma3) is in the cos/sin tables the op is handed
        rows.append(("posenc.rope", {"hq": hq, "hkv": hkv, "d": spec.rotary_dim, "layout": "split_half"}, (),
                     f"{role}.rope", calls))
    rows += [("attention.prefill", scores, ("causal",) + qk_norm, f"{role}.prefill", calls),
             ("attention.decode", scores, qk_norm, f"{role}.decode", calls)]
    if block.output_gate:
        rows.append(("act.sigmoid_gate", {"width": hq * d}, (), f"{role}.output_gate", calls))
    return rows + [("linear", {"k": hq * d, "n": spec.hidden}, _flag("bias", spec.o_bias), f"{role}.o_proj", calls)]


def _gated_deltanet_rows(spec: ModelSpec, calls: int) -> list[Row]:
    """Qwen3.5's linear attention; its four input projections (qkv, z, b, a) walked as one GEMM,
    since all four read the layer's normed input.
    Its output norm, weight * rms_norm(o) * silu(z), is walked as a norm over each value head
    (so called on tokens * value heads rows) and a SwiGLU with z as the gate."""
    g, role = spec.linear_attn, MIXER_ROLES[LINEAR]
    key_width, value_width = g.key_heads * g.key_dim, g.value_heads * g.value_dim
    return [
        ("linear", {"k": spec.hidden, "n": 2 * key_width + 2 * value_width + 2 * g.value_heads}, (),
         f"{role}.in_proj", calls),
        ("conv.causal_depthwise", {"channels": 2 * key_width + value_width, "width": g.conv_kernel}, ("silu",),
         f"{role}.conv1d", calls),
        ("recurrent.deltanet_gates", {"heads": g.value_heads}, (), f"{role}.gates", calls),
        ("recurrent.gated_deltanet", {"hk": g.key_heads, "hv": g.value_heads, "dk": g.key_dim, "dv": g.value_dim},
         ("qk_l2norm",), f"{role}.recurrence", calls),
        ("norm.rms", {"hidden": g.value_dim}, (), f"{role}.norm", calls),
        ("act.swiglu", {"width": value_width}, (), f"{role}.norm_gate", calls),
        ("linear", {"k": value_width, "n": spec.hidden}, (), f"{role}.out_proj", calls),
    ]


def _mlp_rows(spec: ModelSpec) -> list[Row]:
    hidden, width, layers, bias = spec.hidden, spec.intermediate, spec.layers, _flag("bias", spec.mlp_bias)
    # a gated MLP projects gate and up in one linear
    up, up_role = (2 * width, "layers.*.mlp.gate_up_proj") if spec.block.gated_mlp else (width, "layers.*.mlp.up_proj")
    return [("linear", {"k": hidden, "n": up}, bias, up_role, layers),
            (spec.act, {"width": width}, (), "layers.*.mlp.act", layers),
            ("linear", {"k": width, "n": hidden}, bias, "layers.*.mlp.down_proj", layers)]


def _rows(spec: ModelSpec) -> list[Row]:
    """(op, static dims, flags, role, calls per forward) in the order the forward pass meets them.
    Gemma's sandwich norms act on the attention and MLP outputs before the residual add."""
    layers, sandwich = spec.layers, spec.block.sandwich_norms
    rows = [("embedding", {"vocab": spec.vocab, "hidden": spec.hidden}, _flag("scaled", spec.block.scaled_embedding),
             "embed_tokens", 1)]
    if spec.block.learned_positions:
        rows.append(("posenc.learned", {"hidden": spec.hidden}, (), "embed_positions", 1))
    rows += [_norm(spec, "layers.0.input_norm", 1, adds_residual=False),  # no residual yet
             _norm(spec, "layers.*.input_norm", layers - 1, adds_residual=True)]
    for kind, calls in Counter(spec.layer_types).items():
        rows += _gated_deltanet_rows(spec, calls) if kind == LINEAR else _attention_rows(spec, kind, calls)
    if sandwich:
        rows += [_norm(spec, "layers.*.post_attention_norm", layers, adds_residual=False),
                 _norm(spec, "layers.*.pre_feedforward_norm", layers, adds_residual=True)]
    else:
        rows.append(_norm(spec, "layers.*.post_attention_norm", layers, adds_residual=True))
    rows += _mlp_rows(spec)
    if sandwich:
        rows.append(_norm(spec, "layers.*.post_feedforward_norm", layers, adds_residual=False))
    return rows + [_norm(spec, "final_norm", 1, adds_residual=True),
                   ("linear", {"k": spec.hidden, "n": spec.vocab}, (), "lm_head", 1)]


def walk(spec: ModelSpec, dtype: str) -> list[OpInstance]:
    """One OpInstance per distinct op signature, in the order the forward pass meets them."""
    merged: dict[Signature, tuple[list[str], int]] = {}
    for op, static, flags, role, calls in _rows(spec):
        if calls == 0:  # a one-layer model has no layers.* input norm with a residual
            continue
        sig = Signature.make(op, static, flags, dtype)
        roles, count = merged.get(sig, ([], 0))
        merged[sig] = (roles + [role], count + calls)
    return [OpInstance(sig, tuple(roles), count) for sig, (roles, count) in merged.items()]


def unmodelled(spec: ModelSpec) -> list[str]:
    """What the model computes that no op covers (it runs in the model's own code, untuned),
    one line each, with the parts of the checkpoint the walk leaves out."""
    notes = list(spec.not_walked)
    if spec.block.norm == "norm.layer":
        notes.append(f"layers.*: the residual adds ({2 * spec.layers} per forward): elementwise, and no "
                     f"norm.layer op fuses them")
    if spec.logit_softcap:
        notes.append(f"lm_head: the final logit softcap ({spec.logit_softcap:g} * tanh(logits / "
                     f"{spec.logit_softcap:g})): elementwise, no op covers it")
    return notes


def required_features(spec: ModelSpec) -> dict[str, frozenset[str]]:
    """Per op the model runs, the features a kernel must declare to compute every one of its
    signatures (from runtime_loader.ops.required_features, so the two cannot disagree)."""
    features: dict[str, frozenset[str]] = {}
    for instance in walk(spec, "bf16"):  # features do not depend on the dtype
        sig = instance.signature
        features[sig.op] = features.get(sig.op, frozenset()) | signature_features(sig)
    return features
