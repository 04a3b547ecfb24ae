"""The ops: one record per op (OpSchema) with everything the runtime needs, and signatures.

An op signature is the op plus its static dims, flags and dtype, e.g.
``attention.prefill[hq=8,hkv=1,d=128,causal,bf16]``. The solver builds one
decision tree per signature over the op's dynamic dims; the runtime derives the
same signature from the tensors of a call (the record's ``call``) and looks the
tree up. Both sides format signatures with the code here, so they agree.

Each record also says how the op is served: the Dispatcher method (its parameters are
those of the record's ``front``), the cache key and kernel arguments of a call, the
custom op's output shapes (``fake``) and its example inputs. The Dispatcher's methods
and the ``torch.ops.lzsolve.*`` custom ops are generated from these records; the
tuner's half of each op (reference, tolerances, FLOPs and bytes) is lzsolve.ops.CONTRACTS,
attached by op name. CONTRIBUTING.md lists what adding an op takes.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from . import inputs
from .dtypes import DTYPE_NAMES, DTYPES
from .safeio import shown


def like_first(x: Tensor, *args) -> Tensor:
    """The custom op's fake (meta) result for ops whose output is shaped like their first input."""
    return torch.empty_like(x)


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
    # --- how the op is served (several ops may share one method: attention.prefill and .decode) ---
    method: str = ""  # the Dispatcher method and the custom op torch.ops.lzsolve.<method>
    # the method's parameters (annotated, with defaults; its docstring is the method's) -> (cache key,
    # the kernel's arguments); the hot path, so plain attribute reads. The key holds everything that
    # changes the signature: shapes, dtypes, is_cuda (not device.type, which builds an object) and options.
    # A body that is one `return key, kernel_args` reading only the parameters is compiled into the
    # method instead of called (runtime_loader.dispatcher._inlined): a call less per op call
    front: Callable | None = None
    # the method's parameters -> (Signature, dynamic dims), or None for a call no table can hold
    call: Callable | None = None
    inputs: Callable | None = None  # (sig, dims, device, gen) -> the kernel's arguments (runtime_loader.inputs)
    fake: Callable = like_first  # the custom op's output shapes; its return annotation is the op's output type
    consumes: tuple[str, ...] = ()  # parameters whose storage a kernel may overwrite
    # the kernel's arguments of a call no signature describes -> the kernel id that serves it
    # (default: the fallback)
    outside: Callable[..., str] | None = None
    # its fallback is torch ops Inductor fuses with the model's own (row-wise norms, activations,
    # RoPE, embedding lookups): a compiled model keeps that form by default (Dispatcher.traced_fuse)
    fusible: bool = False

    @property
    def all_static(self) -> tuple[str, ...]:
        return self.static + tuple(name for name, _ in self.optional)

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """The Dispatcher method's parameters, self excluded."""
        return list(inspect.signature(self.front, eval_str=True).parameters.values())

    def consumed(self, args: tuple) -> list[int]:
        """The positions in a call's arguments `args` whose storage a kernel may overwrite (consumes)."""
        return [i for i, p in enumerate(self.parameters) if p.name in self.consumes and i < len(args)]


ROPE_LAYOUTS = ("split_half", "interleaved")
# static dims that name a variant, not a size, and the names each may take
NAMED_DIMS = {"layout": ROPE_LAYOUTS}
MAX_DIM = (1 << 63) - 1  # a size past int64 fits no tensor, Parquet column or C integer


def static_problem(op: OpSchema, name: str, value) -> str | None:
    """What a static dim's value read from a file must be, when it is not: a name of NAMED_DIMS; a
    finite number >= 0 for an option whose default is a float (softcap); an integer >= 0 for
    another option (window), >= 1 for a size (hidden: 0 divides by zero where inputs are made)."""
    if name in NAMED_DIMS:
        return None if isinstance(value, str) and value in NAMED_DIMS[name] else f"one of {NAMED_DIMS[name]}"
    real = isinstance(dict(op.optional).get(name), float)
    low = 0 if name not in op.static else 1
    if isinstance(value, bool) or not isinstance(value, (int, float) if real else int) or not low <= value <= MAX_DIM:
        return "a finite number >= 0" if real else f"an integer from {low} to {MAX_DIM}"  # nan fails the comparison
    return None


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
            raise ValueError(f"unknown op {shown(op)}; known: {', '.join(OPS)}")
        static = {**dict(schema.optional), **static}
        if set(static) != set(schema.all_static):
            raise ValueError(f"{op} needs static dims {schema.static} (optional: {dict(schema.optional)}), "
                             f"got {shown(tuple(static))}")
        unknown = set(flags) - set(schema.flags)
        if unknown:
            raise ValueError(f"{op} has no flags {shown(sorted(unknown))}; allowed: {schema.flags}")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {shown(dtype)}; known: {', '.join(DTYPES)}")
        return cls(op, tuple((k, static[k]) for k in schema.all_static), frozenset(flags), dtype)

    @classmethod
    def from_data(cls, op, static, flags, dtype) -> "Signature":
        """A signature read from a file (a table, a workload): `make`, after checking the types a
        call's signature has, so that a static dim "abc" or 1e400 is refused, not kept unmatchable."""
        if not isinstance(op, str) or op not in OPS:
            raise ValueError(f"unknown op {shown(op)}")
        if not isinstance(static, dict) or not isinstance(flags, (list, tuple)) or not isinstance(dtype, str):
            raise ValueError("static must be an object, flags a list and dtype a string")
        for name in OPS[op].all_static:  # make() refuses names the op has not
            problem = static_problem(OPS[op], name, static[name]) if name in static else None
            if problem:
                raise ValueError(f"static dim {name} is {shown(static[name])}, not {problem}")
        if not all(isinstance(flag, str) for flag in flags):
            raise ValueError(f"flags {shown(flags)} are not all strings")
        return cls.make(op, static, flags, dtype)

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
    if static.get("limit"):
        features.add("clamped_swiglu")
    if static.get("ep", 1) > 1:
        features.add("expert_parallel")
    if "hv" in static and static["hv"] != static["hk"]:
        features.add("gqa")
    return frozenset(features)


# --- each op's front and call -------------------------------------------------------------------
# A front's parameters are its Dispatcher method's and custom op's; its call takes the same ones
# (a test checks they match). Options a model seldom sets (window, softcap, unit_offset) reach a
# kernel only when set, so kernels that do not declare them keep their plain call. A call returns
# (signature, dynamic dims), or None when the call is outside what any table can hold (the
# Dispatcher then uses the fallback).

def attention_front(q: Tensor, k: Tensor, v: Tensor, causal: bool = True, scale: float | None = None, window: int = 0,
                    softcap: float = 0.0, sinks: Tensor | None = None, qk_norm: bool = False):
    """SDPA semantics, layout (batch, heads, seq, head_dim); GQA when kv heads divide q heads.
    window: a query at position p sees keys j > p - window, where p is i for query i under a
    causal mask and kv_len - seq_q + i without one (a decode query is the newest token);
    softcap: scaled scores become softcap * tanh(scores / softcap) before the mask (Gemma 2);
    sinks: one learned logit per q head, (q heads,), that joins every row of the softmax's
    denominator and carries no value (GPT-OSS's attention sinks); qk_norm: q and k come from a
    per-head norm (no change to the math, only to which kernels may serve the call)."""
    # v.shape, not k.shape: a valid SDPA call has k.shape == v.shape but for the last dim, which must equal q's
    return ((q.shape, v.shape, q.dtype, q.is_cuda, causal, window, softcap, sinks is None, qk_norm),
            (q, k, v, causal, scale, window, softcap, sinks) if sinks is not None
            else (q, k, v, causal, scale, window, softcap) if window or softcap else (q, k, v, causal, scale))


def attention_call(q, k, v, causal=True, scale=None, window=0, softcap=0.0, sinks=None, qk_norm=False):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES or sinks is not None and sinks.shape != q.shape[1:2]:
        return None
    batch, hq, seq_q, d = q.shape
    hkv, kv_len = k.shape[1], k.shape[2]
    # int and float as the schema's defaults, so softcap=50 and softcap=50.0 name one signature
    static = {"hq": hq, "hkv": hkv, "d": d, "window": int(window), "softcap": float(softcap)}
    dtype = DTYPE_NAMES[q.dtype]
    marker = ("qk_norm",) * qk_norm + ("sinks",) * (sinks is not None)
    if seq_q == kv_len:
        flags = ("causal",) if causal else ()
        return Signature.make("attention.prefill", static, flags + marker, dtype), {"batch": batch, "seq": seq_q}
    if seq_q == 1 and not causal:
        return Signature.make("attention.decode", static, marker, dtype), {"batch": batch, "kv_len": kv_len}
    return None  # e.g. chunked prefill: SDPA's top-left causal alignment is kept by the fallback


def attention_outside(q, k, v, causal, scale, window=0, softcap=0.0, sinks=None) -> str:
    """A call outside the signatures (chunked prefill) goes to SDPA, or to the reference where SDPA
    cannot softcap or take sinks."""
    return "eager.attention" if softcap or sinks is not None else "sdpa.default"


def attention_fake(q: Tensor, k: Tensor, v: Tensor, *args) -> Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def attention_fp8kv_front(q: Tensor, k: Tensor, v: Tensor, k_scale: float = 1.0, v_scale: float = 1.0,
                          scale: float | None = None):
    """A decode step over an FP8 KV cache: q (batch, q heads, 1, d) in the activation dtype, k and
    v (batch, kv heads, kv_len, d) in float8 e4m3, each dequantised by its scale (per tensor, as
    vLLM's and FlashInfer's FP8 caches keep them); GQA when kv heads divide q heads."""
    return (q.shape, v.shape, q.dtype, q.is_cuda), (q, k, v, k_scale, v_scale, scale)


def attention_fp8kv_call(q, k, v, k_scale=1.0, v_scale=1.0, scale=None):
    if (q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES or k.dtype != torch.float8_e4m3fn
            or v.dtype != torch.float8_e4m3fn or q.shape[2] != 1):
        return None
    batch, hq, _, d = q.shape
    static = {"hq": hq, "hkv": k.shape[1], "d": d}
    return (Signature.make("attention.decode_fp8kv", static, (), DTYPE_NAMES[q.dtype]),
            {"batch": batch, "kv_len": k.shape[2]})


def rows_call(op: str, x, flags: tuple[str, ...] = ()):
    """Ops over the last dim of x with every leading dim a token: norms, activations and learned
    positions, whose one static dim (hidden, width) is that last dim."""
    if x.dtype not in DTYPE_NAMES or x.dim() == 0:
        return None
    last = x.shape[-1]
    static = {OPS[op].static[0]: last}
    return Signature.make(op, static, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(last, 1)}


UNIT_OFFSET = ("unit_offset",)
KEEP_INPUTS = ("keep_inputs",)  # norm.rms_add leaves x and residual as they were (see rms_norm_add_front)


def rms_norm_front(x: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """x / rms(x) * weight; unit_offset: * (1 + weight) in fp32, rounded once (Gemma, Qwen3.5)."""
    return (x.shape, x.dtype, x.is_cuda, unit_offset), ((x, weight, eps, True) if unit_offset else (x, weight, eps))


def rms_norm_call(x, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms", x, UNIT_OFFSET if unit_offset else ())


def rms_norm_add_front(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False,
                       keep_inputs: bool = False):
    """(rms_norm(x + residual) * weight, x + residual), the fused residual add of a pre-norm
    block. x and residual are consumed: a kernel may write the results into their storage, as
    serving engines do with their residual stream; keep_inputs: both are left as they were (the
    results in new tensors), for a caller that does not own them (a Hugging Face decoder layer's
    input may be a kept hidden state, or the user's inputs_embeds)."""
    return (x.shape, x.dtype, x.is_cuda, unit_offset, keep_inputs), (
        (x, residual, weight, eps, unit_offset, True) if keep_inputs else
        (x, residual, weight, eps, True) if unit_offset else (x, residual, weight, eps))


def rms_norm_add_fp8_front(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """rms_norm_add's normed rows quantised per token in the same pass: (q, scale, total); x and
    residual are consumed, as rms_norm_add's are."""
    return (x.shape, x.dtype, x.is_cuda, unit_offset), ((x, residual, weight, eps, True) if unit_offset else (x, residual, weight, eps))


def rms_norm_add_call(x, residual, weight, eps=1e-6, unit_offset=False, keep_inputs=False):
    return rows_call("norm.rms_add", x, (UNIT_OFFSET if unit_offset else ()) + (KEEP_INPUTS if keep_inputs else ()))


def rms_norm_fp8_call(x, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms_fp8", x, UNIT_OFFSET if unit_offset else ())


def rms_norm_add_fp8_call(x, residual, weight, eps=1e-6, unit_offset=False):
    return rows_call("norm.rms_add_fp8", x, UNIT_OFFSET if unit_offset else ())


def quantised_rows_fake(x: Tensor, *args) -> tuple[Tensor, Tensor]:
    """The fake result of norm.rms_fp8: (q like x in float8 e4m3, scale (..., 1) fp32)."""
    return torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device), \
        torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)


def quantised_rows_add_fake(x: Tensor, residual: Tensor, *args) -> tuple[Tensor, Tensor, Tensor]:
    """The fake result of norm.rms_add_fp8: quantised_rows_fake's, then the total like residual."""
    return (*quantised_rows_fake(x), torch.empty_like(residual))


def two_like_first(x: Tensor, y: Tensor, *args) -> tuple[Tensor, Tensor]:
    """The fake result of ops returning two tensors shaped like their first two inputs."""
    return torch.empty_like(x), torch.empty_like(y)


def qk_norm_front(x: Tensor, weight: Tensor, eps: float = 1e-6, unit_offset: bool = False):
    """rms_norm of each head of x (..., heads, d) with one weight (d,) (Qwen3's q_norm, k_norm)."""
    return (x.shape, x.dtype, x.is_cuda, unit_offset), ((x, weight, eps, True) if unit_offset else (x, weight, eps))


def qk_norm_call(x, weight=None, eps=1e-6, unit_offset=False):
    """x: (..., heads, d), every leading dim a token."""
    if x.dtype not in DTYPE_NAMES or x.dim() < 2:
        return None
    heads, d = x.shape[-2], x.shape[-1]
    flags = UNIT_OFFSET if unit_offset else ()
    return (Signature.make("norm.qk", {"heads": heads, "d": d}, flags, DTYPE_NAMES[x.dtype]),
            {"tokens": x.numel() // max(heads * d, 1)})


def layer_norm_front(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5):
    """bias None: a LayerNorm without a bias (its own signature, flag no_bias)."""
    return (x.shape, x.dtype, x.is_cuda, bias is None), (x, weight, bias, eps)


def layer_norm_call(x, weight, bias, eps=1e-5):
    return rows_call("norm.layer", x, ("no_bias",) if bias is None else ())


def embedding_front(ids: Tensor, table: Tensor, scale: float | None = None):
    """table[ids] (ids int64), times scale rounded to the table's dtype when given (Gemma's sqrt(hidden))."""
    return (ids.shape, ids.dtype, table.shape, table.dtype, table.is_cuda, scale is None), (ids, table, scale)


def embedding_call(ids, table, scale=None):
    if table.dim() != 2 or table.dtype not in DTYPE_NAMES or ids.dtype != torch.int64:
        return None
    vocab, hidden = table.shape
    flags = ("scaled",) if scale is not None else ()
    return (Signature.make("embedding", {"vocab": vocab, "hidden": hidden}, flags, DTYPE_NAMES[table.dtype]),
            {"tokens": ids.numel()})


def embedding_fake(ids: Tensor, table: Tensor, *args) -> Tensor:
    return table.new_empty((*ids.shape, table.shape[-1]))


def rope_front(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False):
    """Rotary embedding of q (batch, hq, seq, d) and k (batch, hkv, seq, d) with cos/sin
    of shape (batch or 1, seq, d) as Hugging Face builds them; returns (q, k)."""
    return (q.shape, k.shape, q.dtype, q.is_cuda, interleaved), (q, k, cos, sin, interleaved)


def rope_call(q, k, cos=None, sin=None, interleaved=False):
    if q.dim() != 4 or k.dim() != 4 or q.dtype not in DTYPE_NAMES:
        return None
    batch, hq, seq, d = q.shape
    static = {"hq": hq, "hkv": k.shape[1], "d": d, "layout": "interleaved" if interleaved else "split_half"}
    return Signature.make("posenc.rope", static, (), DTYPE_NAMES[q.dtype]), {"tokens": batch * seq}


def learned_positions_front(x: Tensor, positions: Tensor, table: Tensor):
    """x + table[positions] (GPT-2's wpe); positions broadcast against x's leading dims."""
    return (x.shape, x.dtype, x.is_cuda), (x, positions, table)


def gated_front(gate: Tensor, up: Tensor):
    """gate and up: (..., width); the kernel their first argument alone decides."""
    return (gate.shape, gate.dtype, gate.is_cuda), (gate, up)


def one_input_front(x: Tensor):
    return (x.shape, x.dtype, x.is_cuda), (x,)


def rows_op_call(op: str):
    """The call of a rows op with no options: its signature is read from its first argument."""
    def call(x, *args):
        return rows_call(op, x)
    return call


def linear_front(x: Tensor, weight: Tensor, bias: Tensor | None = None):
    """x @ weight.T (+ bias), weight (n, k)."""
    return (x.shape, weight.shape, bias is None, x.dtype, x.is_cuda), (x, weight, bias)


def linear_call(x, weight, bias=None):
    if x.dtype not in DTYPE_NAMES or weight.dim() != 2 or x.dim() == 0:
        return None
    n, k = weight.shape
    flags = ("bias",) if bias is not None else ()
    return Signature.make("linear", {"k": k, "n": n}, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(k, 1)}


def linear_fake(x: Tensor, weight: Tensor, *args) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_fp8_front(x: Tensor, weight: Tensor, weight_scale: Tensor, bias: Tensor | None = None):
    """x @ dequant(weight).T (+ bias) with weight (n, k) in float8 e4m3 and weight_scale (n,) per
    output channel or (1,) per tensor (fp32); x is quantised per token on the fly (W8A8). Returns x's dtype."""
    return ((x.shape, weight.shape, weight_scale.numel(), bias is None, x.dtype, x.is_cuda),
            (x, weight, weight_scale, bias))


def linear_fp8_call(x, weight, weight_scale, bias=None):
    if (x.dtype not in DTYPE_NAMES or weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn or x.dim() == 0
            or weight_scale.numel() not in (1, weight.shape[0])):
        return None
    n, k = weight.shape
    flags = [name for name, on in (("per_channel", weight_scale.numel() > 1), ("bias", bias is not None)) if on]
    return (Signature.make("linear.fp8", {"k": k, "n": n}, flags, DTYPE_NAMES[x.dtype]),
            {"tokens": x.numel() // max(k, 1)})


def linear_fp8_prequantised_front(q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor,
                                  bias: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
    """linear_fp8 of an input already quantised per token (by norm.rms_fp8, say): q (..., k) in
    float8 e4m3 with x_scale (..., 1) fp32, so q * x_scale ~ x; returns out_dtype."""
    return ((q.shape, weight.shape, weight_scale.numel(), bias is None, out_dtype, q.is_cuda),
            (q, x_scale, weight, weight_scale, bias, out_dtype))


def linear_fp8_prequantised_call(q, x_scale, weight, weight_scale, bias=None, out_dtype=torch.bfloat16):
    if (out_dtype not in DTYPE_NAMES or q.dtype != torch.float8_e4m3fn or weight.dim() != 2 or q.dim() == 0
            or weight.dtype != torch.float8_e4m3fn or weight_scale.numel() not in (1, weight.shape[0])
            or x_scale.numel() * q.shape[-1] != q.numel()):
        return None
    n, k = weight.shape
    flags = [name for name, on in (("per_channel", weight_scale.numel() > 1), ("bias", bias is not None)) if on]
    return (Signature.make("linear.fp8_prequantised", {"k": k, "n": n}, flags, DTYPE_NAMES[out_dtype]),
            {"tokens": q.numel() // max(k, 1)})


def linear_prequantised_fake(q: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor,
                             bias: Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return torch.empty((*q.shape[:-1], weight.shape[0]), dtype=out_dtype, device=q.device)


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


def causal_conv1d_front(x: Tensor, weight: Tensor, bias: Tensor | None = None, state: Tensor | None = None,
                        silu: bool = True):
    """Qwen3.5's short causal depthwise conv1d: x (batch, seq, channels), weight (channels,
    width), state (batch, channels, width) the inputs before x or None (zeros); returns (out
    (batch, seq, channels), the new state). The state is consumed: a kernel may roll it in
    place. See lzsolve.ops.conv for the conventions."""
    return ((x.shape, x.stride(), weight.shape, x.dtype, x.is_cuda, bias is None, state is None, silu),
            (x, weight, bias, state, silu))


def causal_conv1d_call(x, weight, bias=None, state=None, silu=True):
    if (x.dim() != 3 or weight.dim() != 2 or x.dtype not in DTYPE_NAMES or weight.shape[0] != x.shape[2]
            or (state is not None and state.shape != (x.shape[0], x.shape[2], weight.shape[1]))):
        return None
    flags = [name for name, on in (("silu", silu), ("bias", bias is not None)) if on]
    static = {"channels": x.shape[2], "width": weight.shape[1]}
    return (Signature.make("conv.causal_depthwise", static, flags, DTYPE_NAMES[x.dtype]),
            {"batch": x.shape[0], "seq": x.shape[1]})


def causal_conv1d_fake(x: Tensor, weight: Tensor, *args) -> tuple[Tensor, Tensor]:
    return x.new_empty(x.shape), x.new_empty((x.shape[0], x.shape[2], weight.shape[1]))


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


def moe_experts_front(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, gate_up: Tensor, down: Tensor,
                      gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, interleaved: bool = False,
                      alpha: float = 0.0, limit: float = 0.0, ep: int = 1):
    """A mixture-of-experts layer's gated expert MLPs over routed tokens: x (tokens, hidden), the
    router's choice topk_ids (tokens, top_k) and weights topk_weights (tokens, top_k); per expert
    e, gate_up[e] (2 * inter, hidden) holds the gate rows then the up rows (interleaved: gate and
    up rows alternate, GPT-OSS), down[e] (hidden, inter), as transformers stores them (or as
    transposed views of weights stored (experts, in, out)); optional biases gate_up_bias (experts,
    2 * inter) and down_bias (experts, hidden). Returns sum over k of weight_k * (down[e_k] @
    act(gate, up) + down_bias[e_k]) with act silu(gate) * up, or with limit > 0 GPT-OSS's
    clamped form: min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clamp(up, +-limit) + 1).
    Under expert parallelism over ep ranks (transformers' convention), gate_up and down hold this
    rank's experts only, and a slot routed to another rank's expert has an id >= their count
    (a sentinel) and weight 0: it adds nothing, and kernels skip it."""
    return ((x.shape, topk_ids.shape, gate_up.shape, x.dtype, x.is_cuda, gate_up.stride(), down.stride(),
             gate_up_bias is None, down_bias is None, interleaved, alpha, limit, ep),
            (x, topk_ids, topk_weights, gate_up, down)
            if gate_up_bias is None and down_bias is None and not interleaved and not limit and ep == 1
            else (x, topk_ids, topk_weights, gate_up, down, gate_up_bias, down_bias, interleaved, alpha, limit, ep))


def is_transposed(weight: Tensor) -> bool:
    """An expert weight (experts, out, in) that is the transposed view of one stored (experts, in, out)."""
    return weight.stride(1) == 1 and weight.stride(2) != 1


def moe_experts_call(x, topk_ids, topk_weights, gate_up, down, gate_up_bias=None, down_bias=None, interleaved=False,
                     alpha=0.0, limit=0.0, ep=1):
    if not isinstance(ep, int) or ep < 1:
        return None
    if (x.dim() != 2 or topk_ids.dim() != 2 or gate_up.dim() != 3 or down.dim() != 3 or x.dtype not in DTYPE_NAMES
            or gate_up.shape[1] != 2 * down.shape[2] or (gate_up_bias is None) != (down_bias is None)):
        return None  # one bias without the other: no signature says so; the fallback computes it
    experts, hidden, inter = gate_up.shape[0], x.shape[1], down.shape[2]
    # alpha means something only with a limit: one signature for every call of the plain form
    static = {"experts": experts, "top_k": topk_ids.shape[1], "hidden": hidden, "inter": inter,
              "alpha": float(alpha) if limit else 0.0, "limit": float(limit), "ep": ep}
    flags = [name for name, on in (("interleaved", interleaved), ("bias", gate_up_bias is not None),
                                   ("transposed", is_transposed(gate_up) and is_transposed(down))) if on]
    return Signature.make("moe.experts", static, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.shape[0]}


def moe_router_front(logits: Tensor, top_k: int, renorm: bool = True):
    """A mixture-of-experts router's choice from its logits (tokens, experts): the top_k experts
    of softmax(logits) in fp32, as (weights float32, ids int64), both (tokens, top_k) in
    descending order; renorm: the weights divided by their sum (softmax over the top_k logits)."""
    return (logits.shape, logits.dtype, logits.is_cuda, top_k, renorm), (logits, top_k, renorm)


def moe_router_call(logits, top_k, renorm=True):
    if logits.dim() != 2 or logits.dtype not in DTYPE_NAMES or not 0 < top_k <= logits.shape[1]:
        return None
    static = {"experts": logits.shape[1], "top_k": top_k}
    return (Signature.make("moe.router", static, ("renorm",) if renorm else (), DTYPE_NAMES[logits.dtype]),
            {"tokens": logits.shape[0]})


def moe_router_fake(logits: Tensor, top_k: int, *args) -> tuple[Tensor, Tensor]:
    shape = (logits.shape[0], top_k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


# --- the records -------------------------------------------------------------------------------------
ATTENTION_OPTIONAL = (("window", 0), ("softcap", 0.0))
ATTENTION = dict(method="attention", front=attention_front, call=attention_call, inputs=inputs.attention,
                 fake=attention_fake, outside=attention_outside)


def _rows_op(name: str, static: str, fallback: str, method: str, front: Callable, inputs_: Callable) -> OpSchema:
    """An op over the last dim with no flags: activations and learned positions (elementwise or a
    lookup, which Inductor fuses)."""
    return OpSchema(name, (static,), (), ("tokens",), fallback, method=method, front=front, call=rows_op_call(name),
                    inputs=inputs_, fusible=True)


OPS: dict[str, OpSchema] = {
    s.name: s
    for s in (
        # window: query i sees keys j with i - window < j (0: all); softcap: scores -> softcap * tanh(scores / softcap);
        # qk_norm: q and k come from a per-head norm (norm.qk), so a kernel must not fuse what precedes it
        # sinks: a learned logit per q head in the softmax's denominator (GPT-OSS)
        OpSchema("attention.prefill", ("hq", "hkv", "d"), ("causal", "qk_norm", "sinks"), ("batch", "seq"),
                 "sdpa.default", ATTENTION_OPTIONAL, "eager.attention", **ATTENTION),
        OpSchema("attention.decode", ("hq", "hkv", "d"), ("qk_norm", "sinks"), ("batch", "kv_len"), "sdpa.default",
                 ATTENTION_OPTIONAL, "eager.attention", **ATTENTION),
        # a decode step over an FP8 (e4m3) KV cache with a scale for k and one for v
        OpSchema("attention.decode_fp8kv", ("hq", "hkv", "d"), (), ("batch", "kv_len"), "eager.attention_fp8kv",
                 method="attention_fp8kv", front=attention_fp8kv_front, call=attention_fp8kv_call,
                 inputs=inputs.attention_fp8kv, fake=attention_fake),
        # unit_offset: Gemma's norms scale by (1 + weight)
        OpSchema("norm.rms", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm", method="rms_norm",
                 front=rms_norm_front, call=rms_norm_call, inputs=inputs.rms_norm, fusible=True),
        OpSchema("norm.rms_add", ("hidden",), ("unit_offset", "keep_inputs"), ("tokens",), "eager.rms_norm_add",
                 method="rms_norm_add", front=rms_norm_add_front, call=rms_norm_add_call, inputs=inputs.rms_norm_add,
                 fake=two_like_first, consumes=("x", "residual"), fusible=True),
        # the norm before an FP8 W8A8 linear, its output quantised per token to float8 e4m3 in the same
        # pass, as linear.fp8 quantises its input: (q, scale (..., 1) fp32), q * scale ~ the normed rows;
        # the _add form returns the total third (written into residual's storage, as norm.rms_add may)
        OpSchema("norm.rms_fp8", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm_fp8",
                 method="rms_norm_fp8", front=rms_norm_front, call=rms_norm_fp8_call, inputs=inputs.rms_norm,
                 fake=quantised_rows_fake),
        OpSchema("norm.rms_add_fp8", ("hidden",), ("unit_offset",), ("tokens",), "eager.rms_norm_add_fp8",
                 method="rms_norm_add_fp8", front=rms_norm_add_fp8_front, call=rms_norm_add_fp8_call,
                 inputs=inputs.rms_norm_add, fake=quantised_rows_add_fake, consumes=("x", "residual")),
        OpSchema("norm.qk", ("heads", "d"), ("unit_offset",), ("tokens",), "eager.qk_norm", method="qk_norm",
                 front=qk_norm_front, call=qk_norm_call, inputs=inputs.qk_norm, fusible=True),
        # no_bias: LayerNorm without a bias (Cohere, StableLM-2 variants): bias None in the call
        OpSchema("norm.layer", ("hidden",), ("no_bias",), ("tokens",), "eager.layer_norm", method="layer_norm",
                 front=layer_norm_front, call=layer_norm_call, inputs=inputs.layer_norm, fusible=True),
        OpSchema("posenc.rope", ("hq", "hkv", "d", "layout"), (), ("tokens",), "eager.rope", method="rope",
                 front=rope_front, call=rope_call, inputs=inputs.rope, fake=two_like_first, fusible=True),
        _rows_op("posenc.learned", "hidden", "eager.learned_positions", "learned_positions", learned_positions_front,
                 inputs.learned_positions),
        OpSchema("embedding", ("vocab", "hidden"), ("scaled",), ("tokens",), "eager.embedding", method="embedding",
                 front=embedding_front, call=embedding_call, inputs=inputs.embedding, fake=embedding_fake, fusible=True),
        _rows_op("act.swiglu", "width", "eager.swiglu", "swiglu", gated_front, inputs.gated),
        # the SwiGLU before an FP8 linear (down_proj), its output quantised per token in the same pass:
        # (q, scale (..., 1) fp32), as norm.rms_fp8
        OpSchema("act.swiglu_fp8", ("width",), (), ("tokens",), "eager.swiglu_fp8", method="swiglu_fp8",
                 front=gated_front, call=rows_op_call("act.swiglu_fp8"), inputs=inputs.gated, fake=quantised_rows_fake),
        _rows_op("act.geglu", "width", "eager.geglu", "geglu", gated_front, inputs.gated),
        _rows_op("act.gelu", "width", "eager.gelu", "gelu", one_input_front, inputs.one_row),
        _rows_op("act.sigmoid_gate", "width", "eager.sigmoid_gate", "sigmoid_gate", gated_front, inputs.two_rows),
        OpSchema("linear", ("k", "n"), ("bias",), ("tokens",), "torch.linear", method="linear", front=linear_front,
                 call=linear_call, inputs=inputs.linear, fake=linear_fake),
        # weights in float8 e4m3 (W8A8, activations quantised per token); per_channel: one weight scale per
        # output channel, else one per tensor
        OpSchema("linear.fp8", ("k", "n"), ("per_channel", "bias"), ("tokens",), "eager.linear_fp8",
                 method="linear_fp8", front=linear_fp8_front, call=linear_fp8_call, inputs=inputs.linear_fp8,
                 fake=linear_fake),
        # the same with x quantised beforehand (norm.rms_fp8 fuses it into the norm): the output dtype is the signature's
        OpSchema("linear.fp8_prequantised", ("k", "n"), ("per_channel", "bias"), ("tokens",),
                 "eager.linear_fp8_prequantised", method="linear_fp8_prequantised", front=linear_fp8_prequantised_front,
                 call=linear_fp8_prequantised_call, inputs=inputs.linear_fp8_prequantised, fake=linear_prequantised_fake),
        # renorm: the top_k weights divided by their sum (Mixtral, Qwen3-MoE; GraniteMoE's softmax over the top_k)
        OpSchema("moe.router", ("experts", "top_k"), ("renorm",), ("tokens",), "eager.moe_router",
                 method="moe_router", front=moe_router_front, call=moe_router_call, inputs=inputs.moe_router,
                 fake=moe_router_fake),
        # experts: the experts this rank holds (all of them, or 1/ep under expert parallelism); inter:
        # each expert's intermediate width on this rank; interleaved: gate and up rows alternate;
        # bias: both projections biased; transposed: the weights are views of ones stored (experts,
        # in, out) (GPT-OSS), which kernels read in another order; limit, alpha: GPT-OSS's clamped
        # SwiGLU; ep: the ranks the experts are divided over (the routing spreads over experts * ep,
        # the other ranks' slots are sentinels)
        OpSchema("moe.experts", ("experts", "top_k", "hidden", "inter"), ("interleaved", "bias", "transposed"),
                 ("tokens",), "torch.grouped_mm", (("alpha", 0.0), ("limit", 0.0), ("ep", 1)), method="moe_experts",
                 front=moe_experts_front, call=moe_experts_call, inputs=inputs.moe_experts),
        # the causal depthwise conv1d before it: width taps per channel; silu: SiLU after; bias: a bias per channel
        OpSchema("conv.causal_depthwise", ("channels", "width"), ("silu", "bias"), ("batch", "seq"),
                 "eager.causal_conv1d", method="causal_conv1d", front=causal_conv1d_front, call=causal_conv1d_call,
                 inputs=inputs.causal_conv1d, fake=causal_conv1d_fake, consumes=("state",)),
        # its gates per token and value head (heads: value heads)
        OpSchema("recurrent.deltanet_gates", ("heads",), (), ("tokens",), "eager.deltanet_gates",
                 method="deltanet_gates", front=deltanet_gates_front, call=deltanet_gates_call,
                 inputs=inputs.deltanet_gates, fake=deltanet_gates_fake),
        # Gated DeltaNet (Qwen3.5's linear attention): hk key heads, hv value heads (hv % hk == 0)
        OpSchema("recurrent.gated_deltanet", ("hk", "hv", "dk", "dv"), ("qk_l2norm",), ("batch", "seq"),
                 "eager.gated_deltanet", method="gated_deltanet", front=gated_deltanet_front, call=gated_deltanet_call,
                 inputs=inputs.gated_deltanet, fake=gated_deltanet_fake),
    )
}


def check_op(op: OpSchema) -> None:
    """ValueError unless the record can be served: a method, a front, a call that takes the front's
    parameters, and inputs. Run on every op at import and by register_op."""
    missing = [name for name in ("method", "front", "call", "inputs") if not getattr(op, name)]
    if missing:
        raise ValueError(f"op {op.name} has no {', '.join(missing)}")
    if not op.method.isidentifier():
        raise ValueError(f"op {op.name}: method {op.method!r} is not a Python name")
    names = [p.name for p in op.parameters]
    try:
        inspect.signature(op.call).bind(*names)
    except TypeError as e:
        raise ValueError(f"op {op.name}: its call does not take its front's parameters {names}: {e}") from None
    unknown = set(op.consumes) - set(names)
    if unknown:
        raise ValueError(f"op {op.name} consumes {sorted(unknown)}, which are not parameters of {op.method}")


def register_op(op: OpSchema) -> OpSchema:
    """Add an op (a plugin's, or a test's): checked, then known to signatures, the registry and the
    Dispatcher (runtime_loader.dispatcher.serve_op makes its method and custom op)."""
    check_op(op)
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is already registered")
    OPS[op.name] = op
    return op


for _op in OPS.values():
    check_op(_op)


def method_args(sig: Signature, kernel_args: tuple) -> tuple:
    """The Dispatcher method's arguments for a kernel's arguments: the parameters the kernel call
    leaves out take the signature's flag where a boolean one is named after them (qk_norm,
    unit_offset), their default otherwise (sinks: a flag, but the tensor itself is the argument)."""
    op = OPS[sig.op]
    rest = op.parameters[len(kernel_args):]
    return tuple(kernel_args) + tuple(p.name in sig.flags if p.name in op.flags and isinstance(p.default, bool)
                                      else p.default for p in rest)


def example_args(sig: Signature, dims: dict, device) -> tuple:
    """Random arguments of the right shapes for the Dispatcher method that serves `sig`, flags
    and options included (for warm-up calls, not for checking), drawn from a private generator
    so a server's own random stream is left alone."""
    gen = torch.Generator(device=device).manual_seed(0)
    return method_args(sig, OPS[sig.op].inputs(sig, dims, torch.device(device), gen))
