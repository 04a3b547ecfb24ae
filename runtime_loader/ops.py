"""Op schemas and signatures: the part of each op's contract that the runtime needs.

An op signature is the op plus its static dims, flags and dtype, e.g.
``attention.prefill[hq=8,hkv=1,d=128,causal,bf16]``. The solver builds one
decision tree per signature over the op's dynamic dims; the runtime derives the
same signature from the tensors of a call (``signature_of_call``) and looks the
tree up. Both sides format signatures with the code here, so they agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class OpSchema:
    name: str
    static: tuple[str, ...]  # dims fixed per signature, in canonical order
    flags: tuple[str, ...]  # booleans that split signatures (causal, bias)
    dynamic: tuple[str, ...]  # dims that vary while serving; trees split on them
    fallback: str  # kernel id used for anything outside the table
    # static dims that most models leave at a default (e.g. no sliding window): named in a
    # signature only when set, so signatures of models without them read as before
    optional: tuple[tuple[str, int | float], ...] = ()
    reference: str | None = None  # the fallback for signatures `fallback` does not support (e.g. softcap)

    @property
    def all_static(self) -> tuple[str, ...]:
        return self.static + tuple(name for name, _ in self.optional)


ATTENTION_OPTIONAL = (("window", 0), ("softcap", 0.0))
OPS: dict[str, OpSchema] = {
    s.name: s
    for s in (
        # window: query i sees keys j with i - window < j (0: all); softcap: scores -> softcap * tanh(scores / softcap);
        # qk_norm: q and k come from a per-head norm (norm.qk), so a kernel must not fuse what precedes it
        OpSchema("attention.prefill", ("hq", "hkv", "d"), ("causal", "qk_norm"), ("batch", "seq"), "sdpa.default",
                 ATTENTION_OPTIONAL, "eager.attention"),
        OpSchema("attention.decode", ("hq", "hkv", "d"), ("qk_norm",), ("batch", "kv_len"), "sdpa.default",
                 ATTENTION_OPTIONAL, "eager.attention"),
        # unit_offset: Gemma's norms scale by (1 + weight)
        OpSchema("norm.rms", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm"),
        OpSchema("norm.rms_add", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm_add"),
        OpSchema("norm.qk", ("heads", "d"), ("unit_offset",), ("tokens",), "eager.qk_norm"),
        # no_bias: LayerNorm without a bias (Cohere, StableLM-2 variants): bias None in the call
        OpSchema("norm.layer", ("hidden",), ("no_bias",), ("tokens",), "eager.layer_norm"),
        OpSchema("posenc.rope", ("hq", "hkv", "d", "layout"), (), ("tokens",), "eager.rope"),
        OpSchema("posenc.learned", ("hidden",), (), ("tokens",), "eager.learned_positions"),
        OpSchema("embedding", ("vocab", "hidden"), ("scaled",), ("tokens",), "eager.embedding"),
        OpSchema("act.swiglu", ("width",), (), ("tokens",), "eager.swiglu"),
        OpSchema("act.geglu", ("width",), (), ("tokens",), "eager.geglu"),
        OpSchema("act.gelu", ("width",), (), ("tokens",), "eager.gelu"),
        OpSchema("act.sigmoid_gate", ("width",), (), ("tokens",), "eager.sigmoid_gate"),
        OpSchema("linear", ("k", "n"), ("bias",), ("tokens",), "torch.linear"),
        # Gated DeltaNet (Qwen3.5's linear attention): hk key heads, hv value heads (hv % hk == 0)
        OpSchema("recurrent.gated_deltanet", ("hk", "hv", "dk", "dv"), ("qk_l2norm",), ("batch", "seq"),
                 "eager.gated_deltanet"),
    )
}

ROPE_LAYOUTS = ("split_half", "interleaved")


@dataclass(frozen=True)
class Signature:
    op: str
    static: tuple[tuple[str, int | str], ...]
    flags: frozenset[str]
    dtype: str

    @classmethod
    def make(cls, op: str, static: Mapping[str, int | float | str], flags=(), dtype: str = "bf16") -> "Signature":
        """Build a signature, checking names against the op's schema (optional dims may be left out)."""
        schema = OPS.get(op)
        if schema is None:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
        static = {**dict(schema.optional), **static}
        if set(static) != set(schema.all_static):
            raise ValueError(f"{op} needs static dims {schema.static} (optional: {dict(schema.optional)}), "
                             f"got {tuple(static)}")
        unknown = set(flags) - set(schema.flags)
        if unknown:
            raise ValueError(f"{op} has no flags {sorted(unknown)}; allowed: {schema.flags}")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        return cls(op, tuple((k, static[k]) for k in schema.all_static), frozenset(flags), dtype)

    @property
    def schema(self) -> OpSchema:
        return OPS[self.op]

    def dim(self, name: str) -> int | str:
        return dict(self.static)[name]

    def __str__(self) -> str:
        defaults = dict(self.schema.optional)
        parts = [f"{k}={v}" for k, v in self.static if k not in defaults or v != defaults[k]]
        parts += [f for f in self.schema.flags if f in self.flags]
        parts.append(self.dtype)
        return f"{self.op}[{','.join(parts)}]"

    def to_json(self) -> dict:
        defaults = dict(self.schema.optional)
        static = {k: v for k, v in self.static if k not in defaults or v != defaults[k]}
        return {"op": self.op, "static": static, "flags": sorted(self.flags), "dtype": self.dtype}


def required_features(sig: Signature) -> frozenset[str]:
    """Features a kernel must declare to compute this signature correctly."""
    features = set(sig.flags)
    static = dict(sig.static)
    if "hkv" in static and static["hq"] != static["hkv"]:
        features.add("gqa")
    if "layout" in static:
        features.add(f"rope_{static['layout']}")
    if static.get("window"):
        features.add("sliding_window")
    if static.get("softcap"):
        features.add("softcap")
    if "hv" in static and static["hv"] != static["hk"]:
        features.add("gqa")
    return frozenset(features)


# --- signatures of runtime calls -------------------------------------------------
# Each returns (signature, dynamic dims) for a call, or None when the call is
# outside what any table can hold (the dispatcher then uses the fallback).

def attention_call(q, k, v, causal: bool, window: int = 0, softcap: float = 0.0, qk_norm: bool = False):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    # int and float as the schema's defaults, so softcap=50 and softcap=50.0 name one signature
    static = {"hq": hq, "hkv": hkv, "d": d, "window": int(window), "softcap": float(softcap)}
    dtype = DTYPE_NAMES[q.dtype]
    marker = ("qk_norm",) if qk_norm else ()
    if seq_q == kv_len:
        flags = ("causal",) if causal else ()
        return Signature.make("attention.prefill", static, flags + marker, dtype), {"batch": batch, "seq": seq_q}
    if seq_q == 1 and not causal:
        return Signature.make("attention.decode", static, marker, dtype), {"batch": batch, "kv_len": kv_len}
    return None  # e.g. chunked prefill: SDPA's top-left causal alignment is kept by the fallback


def rows_call(op: str, x, flags: tuple[str, ...] = ()):
    """Ops over the last dim of x with every leading dim a token: norms, activations and learned
    positions, whose one static dim (hidden, width) is that last dim."""
    if x.dtype not in DTYPE_NAMES or x.dim() == 0:
        return None
    last = x.shape[-1]
    static = {OPS[op].static[0]: last}
    return Signature.make(op, static, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(last, 1)}


def qk_norm_call(x, unit_offset: bool):
    """x: (..., heads, d), every leading dim a token."""
    if x.dtype not in DTYPE_NAMES or x.dim() < 2:
        return None
    heads, d = x.shape[-2], x.shape[-1]
    flags = ("unit_offset",) if unit_offset else ()
    return (Signature.make("norm.qk", {"heads": heads, "d": d}, flags, DTYPE_NAMES[x.dtype]),
            {"tokens": x.numel() // max(heads * d, 1)})


def embedding_call(ids, table, scale):
    if table.dim() != 2 or table.dtype not in DTYPE_NAMES or ids.dtype != torch.int64:
        return None
    vocab, hidden = table.shape
    flags = ("scaled",) if scale is not None else ()
    return (Signature.make("embedding", {"vocab": vocab, "hidden": hidden}, flags, DTYPE_NAMES[table.dtype]),
            {"tokens": ids.numel()})


def gated_deltanet_call(q, v, qk_l2norm: bool):
    """q: (batch, seq, hk, dk), v: (batch, seq, hv, dv); k has q's shape."""
    if q.dim() != 4 or v.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, seq, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    flags = ("qk_l2norm",) if qk_l2norm else ()
    static = {"hk": hk, "hv": hv, "dk": dk, "dv": dv}
    return (Signature.make("recurrent.gated_deltanet", static, flags, DTYPE_NAMES[q.dtype]),
            {"batch": batch, "seq": seq})


def rope_call(q, k, interleaved: bool):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, hq, seq, d = q.shape
    static = {"hq": hq, "hkv": k.shape[1], "d": d, "layout": "interleaved" if interleaved else "split_half"}
    return Signature.make("posenc.rope", static, (), DTYPE_NAMES[q.dtype]), {"tokens": batch * seq}


def linear_call(x, weight, bias):
    if x.dtype not in DTYPE_NAMES or weight.dim() != 2 or x.dim() == 0:
        return None
    n, k = weight.shape
    flags = ("bias",) if bias is not None else ()
    return Signature.make("linear", {"k": k, "n": n}, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(k, 1)}


def example_args(sig: Signature, dims: dict, device) -> tuple:
    """Random arguments of the right shapes for the Dispatcher method that serves `sig`, flags
    and options included (for warm-up calls, not for checking), drawn from a private generator
    so a server's own random stream is left alone."""
    dtype = DTYPES[sig.dtype]
    s = dict(sig.static)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, dtype=dtype):
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    def randint(high, *shape):
        return torch.randint(0, high, shape, device=device, generator=gen)

    unit_offset = "unit_offset" in sig.flags
    if sig.op in ("attention.prefill", "attention.decode"):
        seq_q, kv_len = (dims["seq"], dims["seq"]) if "seq" in dims else (1, dims["kv_len"])
        return (randn(dims["batch"], s["hq"], seq_q, s["d"]), randn(dims["batch"], s["hkv"], kv_len, s["d"]),
                randn(dims["batch"], s["hkv"], kv_len, s["d"]), "causal" in sig.flags, None, s["window"],
                s["softcap"], "qk_norm" in sig.flags)
    if sig.op == "recurrent.gated_deltanet":
        batch, seq = dims["batch"], dims["seq"]
        return (randn(batch, seq, s["hk"], s["dk"]), randn(batch, seq, s["hk"], s["dk"]),
                randn(batch, seq, s["hv"], s["dv"]), -randn(batch, seq, s["hv"], dtype=torch.float32).abs(),
                randn(batch, seq, s["hv"]).sigmoid(), randn(batch, s["hv"], s["dk"], s["dv"], dtype=torch.float32),
                "qk_l2norm" in sig.flags)
    tokens = dims["tokens"]
    if sig.op == "norm.rms":
        return randn(tokens, s["hidden"]), randn(s["hidden"]), 1e-6, unit_offset
    if sig.op == "norm.rms_add":
        return randn(tokens, s["hidden"]), randn(tokens, s["hidden"]), randn(s["hidden"]), 1e-6, unit_offset
    if sig.op == "norm.qk":
        return randn(tokens, s["heads"], s["d"]), randn(s["d"]), 1e-6, unit_offset
    if sig.op == "norm.layer":
        return randn(tokens, s["hidden"]), randn(s["hidden"]), None if "no_bias" in sig.flags else randn(s["hidden"]), 1e-5
    if sig.op == "posenc.rope":
        return (randn(1, s["hq"], tokens, s["d"]), randn(1, s["hkv"], tokens, s["d"]), randn(1, tokens, s["d"]),
                randn(1, tokens, s["d"]), s["layout"] == "interleaved")
    if sig.op == "posenc.learned":
        return randn(tokens, s["hidden"]), randint(tokens, tokens), randn(tokens, s["hidden"])
    if sig.op == "embedding":
        scale = s["hidden"] ** 0.5 if "scaled" in sig.flags else None
        return randint(s["vocab"], tokens), randn(s["vocab"], s["hidden"]), scale
    if sig.op in ("act.swiglu", "act.geglu", "act.sigmoid_gate"):
        return randn(tokens, s["width"]), randn(tokens, s["width"])
    if sig.op == "act.gelu":
        return (randn(tokens, s["width"]),)
    if sig.op == "linear":
        return randn(tokens, s["k"]), randn(s["n"], s["k"]), randn(s["n"]) if "bias" in sig.flags else None
    raise ValueError(f"no example arguments for {sig.op}")
