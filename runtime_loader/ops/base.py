"""What every op record is made of: OpSchema (one per op, with everything the runtime needs),
Signature (an op with its static dims, flags and dtype), and the registry of records, OPS, which
the family modules of this package fill.

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

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..dtypes import DTYPE_NAMES, DTYPES
from ..safeio import shown

OPS: dict[str, OpSchema] = {}  # op name -> record: every family module's RECORDS, then plugins' (register_op)


def like_first(x: Tensor, *args) -> Tensor:
    """The custom op's fake (meta) result for ops whose output is shaped like their first input."""
    return torch.empty_like(x)


def two_like_first(x: Tensor, y: Tensor, *args) -> tuple[Tensor, Tensor]:
    """The fake result of ops returning two tensors shaped like their first two inputs."""
    return torch.empty_like(x), torch.empty_like(y)


def promoted(*tensors: Tensor) -> torch.dtype:
    """The dtype PyTorch's type promotion gives a product or sum of these tensors (bf16 and fp32: fp32)."""
    return functools.reduce(torch.promote_types, (t.dtype for t in tensors))


def promoted_like_first(x: Tensor, y: Tensor, *args) -> Tensor:
    """The fake result of ops shaped like x whose module multiplies or adds x and y in PyTorch's
    promotion (SwiGLU's silu(gate) * up): a call whose y has another dtype than x (OpSchema.same_dtype)
    gets the promoted dtype from the fallback, and the fake must say what the real op returns."""
    return torch.empty_like(x, dtype=promoted(x, y))


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
    # flags that narrow which kernels may serve a call without changing what it computes (attention's
    # qk_norm): a kernel timed under one is timed for the signature without it (the tuner shares them)
    labels: tuple[str, ...] = ()
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
    # tensor parameters the tuner makes in the signature's dtype besides the one that dtype is read
    # from (a norm's weight): a call passing one in another dtype (bf16 x, fp32 weight) is not what the
    # table was tuned for and takes the fallback, which returns the dtype the module's own PyTorch code
    # does (its promotion, fp32, for RMSNorm's weight * x and RoPE's q * cos; x's, bf16, for
    # F.layer_norm), so that a call's result never depends on the table's coverage (read). `fake` gives
    # the same dtype (a custom op under torch.compile). Each one's dtype is in the key.
    same_dtype: tuple[str, ...] = ()
    # the kernel's arguments of a call no signature describes -> the kernel id that serves it
    # (default: the fallback)
    outside: Callable[..., str] | None = None
    # its fallback is torch ops Inductor fuses with the model's own (row-wise norms, activations,
    # RoPE, embedding lookups): a compiled model keeps that form by default (Dispatcher.traced_fuse)
    fusible: bool = False
    # the tuner's buckets of the dynamic dims per named grid (tiny, small, full: lzsolve.measure.grid), for
    # ops not keyed by tokens alone; None: the grid's token buckets
    buckets: Mapping[str, Mapping[str, tuple[int, ...]]] | None = field(default=None, compare=False, hash=False)

    @property
    def all_static(self) -> tuple[str, ...]:
        return self.static + tuple(name for name, _ in self.optional)

    @property
    def parameters(self) -> list[inspect.Parameter]:
        """The Dispatcher method's parameters, self excluded."""
        return list(inspect.signature(self.front, eval_str=True).parameters.values())

    @functools.cached_property
    def _same_dtype_at(self) -> tuple[tuple[int, str], ...]:
        return tuple((i, p.name) for i, p in enumerate(self.parameters) if p.name in self.same_dtype)

    def read(self, *args, **kwargs):
        """A call of the method (its arguments) as `call` reads it: (signature, dynamic dims), or None
        where no signature describes it; with a third item, why the table may not serve it though its
        signature is the table's (a same_dtype parameter in another dtype than the signature's)."""
        call = self.call(*args, **kwargs)
        if call is None or not self.same_dtype:
            return call
        for i, name in self._same_dtype_at:
            value = kwargs[name] if name in kwargs else args[i] if i < len(args) else None
            if isinstance(value, Tensor) and value.dtype != DTYPES[call[0].dtype]:
                found = DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
                return (*call, f"{name} is {found}, not the signature's {call[0].dtype}: the fallback computes it as "
                                "PyTorch does")
        return call

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
    def make(cls, op: str, static: Mapping[str, int | float | str], flags=(), dtype: str = "bf16") -> Signature:
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
    def from_data(cls, op, static, flags, dtype) -> Signature:
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


# --- helpers of the families' calls and records ----------------------------------------------------
def rows_call(op: str, x, flags: tuple[str, ...] = ()):
    """Ops over the last dim of x with every leading dim a token: norms, activations and learned
    positions, whose one static dim (hidden, width) is that last dim."""
    if x.dtype not in DTYPE_NAMES or x.dim() == 0:
        return None
    last = x.shape[-1]
    static = {OPS[op].static[0]: last}
    return Signature.make(op, static, flags, DTYPE_NAMES[x.dtype]), {"tokens": x.numel() // max(last, 1)}


def rows_op_call(op: str):
    """The call of a rows op with no options: its signature is read from its first argument."""
    def call(x, *args):
        return rows_call(op, x)
    return call


def rows_op(name: str, static: str, fallback: str, method: str, front: Callable, inputs_: Callable,
            same_dtype: tuple[str, ...] = (), fake: Callable = like_first) -> OpSchema:
    """An op over the last dim with no flags: activations and learned positions (elementwise or a
    lookup, which Inductor fuses)."""
    return OpSchema(name, (static,), (), ("tokens",), fallback, method=method, front=front, call=rows_op_call(name),
                    inputs=inputs_, fake=fake, same_dtype=same_dtype, fusible=True)


# --- registering and calling records -------------------------------------------------------------------
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
    for field_name in ("consumes", "same_dtype"):
        unknown = set(getattr(op, field_name)) - set(names)
        if unknown:
            raise ValueError(f"op {op.name}: {field_name} names {sorted(unknown)}, which are not parameters of "
                             f"{op.method}")


def register_op(op: OpSchema) -> OpSchema:
    """Add an op (a plugin's, or a test's): checked, then known to signatures, the registry and the
    Dispatcher (runtime_loader.dispatcher.serve_op makes its method and custom op)."""
    check_op(op)
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is already registered")
    OPS[op.name] = op
    return op


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
