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


OPS: dict[str, OpSchema] = {
    s.name: s
    for s in (
        OpSchema("attention.prefill", ("hq", "hkv", "d"), ("causal",), ("batch", "seq"), "sdpa.default"),
        OpSchema("attention.decode", ("hq", "hkv", "d"), (), ("batch", "kv_len"), "sdpa.default"),
        OpSchema("norm.rms", ("hidden",), (), ("tokens",), "eager.rms_norm"),
        OpSchema("norm.rms_add", ("hidden",), (), ("tokens",), "eager.rms_norm_add"),
        OpSchema("norm.layer", ("hidden",), (), ("tokens",), "eager.layer_norm"),
        OpSchema("posenc.rope", ("hq", "hkv", "d", "layout"), (), ("tokens",), "eager.rope"),
        OpSchema("act.swiglu", ("width",), (), ("tokens",), "eager.swiglu"),
        OpSchema("act.geglu", ("width",), (), ("tokens",), "eager.geglu"),
        OpSchema("act.gelu", ("width",), (), ("tokens",), "eager.gelu"),
        OpSchema("linear", ("k", "n"), ("bias",), ("tokens",), "torch.linear"),
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
    def make(cls, op: str, static: Mapping[str, int | str], flags=(), dtype: str = "bf16") -> "Signature":
        """Build a signature, checking names against the op's schema."""
        schema = OPS.get(op)
        if schema is None:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
        if set(static) != set(schema.static):
            raise ValueError(f"{op} needs static dims {schema.static}, got {tuple(static)}")
        unknown = set(flags) - set(schema.flags)
        if unknown:
            raise ValueError(f"{op} has no flags {sorted(unknown)}; allowed: {schema.flags}")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
        return cls(op, tuple((k, static[k]) for k in schema.static), frozenset(flags), dtype)

    @property
    def schema(self) -> OpSchema:
        return OPS[self.op]

    def dim(self, name: str) -> int | str:
        return dict(self.static)[name]

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.static]
        parts += [f for f in self.schema.flags if f in self.flags]
        parts.append(self.dtype)
        return f"{self.op}[{','.join(parts)}]"

    def to_json(self) -> dict:
        return {"op": self.op, "static": dict(self.static), "flags": sorted(self.flags), "dtype": self.dtype}


def required_features(sig: Signature) -> frozenset[str]:
    """Features a kernel must declare to compute this signature correctly."""
    features = set(sig.flags)
    static = dict(sig.static)
    if "hkv" in static and static["hq"] != static["hkv"]:
        features.add("gqa")
    if "layout" in static:
        features.add(f"rope_{static['layout']}")
    return frozenset(features)


# --- signatures of runtime calls -------------------------------------------------
# Each returns (signature, dynamic dims) for a call, or None when the call is
# outside what any table can hold (the dispatcher then uses the fallback).

def attention_call(q, k, v, causal: bool):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    static = {"hq": hq, "hkv": hkv, "d": d}
    dtype = DTYPE_NAMES[q.dtype]
    if seq_q == kv_len:
        flags = ("causal",) if causal else ()
        return Signature.make("attention.prefill", static, flags, dtype), {"batch": batch, "seq": seq_q}
    if seq_q == 1 and not causal:
        return Signature.make("attention.decode", static, (), dtype), {"batch": batch, "kv_len": kv_len}
    return None  # e.g. chunked prefill: SDPA's top-left causal alignment is kept by the fallback


def rows_call(op: str, x):
    """Ops over the last dim of x with every leading dim a token: norms and activations,
    whose one static dim (hidden, width) is that last dim."""
    if x.dtype not in DTYPE_NAMES or x.dim() == 0:
        return None
    last = x.shape[-1]
    static = {OPS[op].static[0]: last}
    return Signature.make(op, static, (), DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(last, 1)}


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
    """Random canonical arguments of the right shapes (for warm-up calls, not for checking),
    drawn from a private generator so a server's own random stream is left alone."""
    dtype = DTYPES[sig.dtype]
    s = dict(sig.static)
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    if sig.op in ("attention.prefill", "attention.decode"):
        seq_q, kv_len = (dims["seq"], dims["seq"]) if "seq" in dims else (1, dims["kv_len"])
        return (randn(dims["batch"], s["hq"], seq_q, s["d"]), randn(dims["batch"], s["hkv"], kv_len, s["d"]),
                randn(dims["batch"], s["hkv"], kv_len, s["d"]), "causal" in sig.flags, None)
    tokens = dims["tokens"]
    if sig.op == "norm.rms":
        return randn(tokens, s["hidden"]), randn(s["hidden"]), 1e-6
    if sig.op == "norm.rms_add":
        return randn(tokens, s["hidden"]), randn(tokens, s["hidden"]), randn(s["hidden"]), 1e-6
    if sig.op == "norm.layer":
        return randn(tokens, s["hidden"]), randn(s["hidden"]), randn(s["hidden"]), 1e-5
    if sig.op == "posenc.rope":
        return (randn(1, s["hq"], tokens, s["d"]), randn(1, s["hkv"], tokens, s["d"]), randn(1, tokens, s["d"]),
                randn(1, tokens, s["d"]), s["layout"] == "interleaved")
    if sig.op in ("act.swiglu", "act.geglu"):
        return randn(tokens, s["width"]), randn(tokens, s["width"])
    if sig.op == "act.gelu":
        return (randn(tokens, s["width"]),)
    if sig.op == "linear":
        return randn(tokens, s["k"]), randn(s["n"], s["k"]), randn(s["n"]) if "bias" in sig.flags else None
    raise ValueError(f"no example arguments for {sig.op}")
