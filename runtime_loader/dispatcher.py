"""The Dispatcher: replays a dispatch table with a dict lookup per call.

A call's key is built from shapes, dtype and device kind (no allocation, no
formatting); the first call with a new key derives the op signature, walks the
tree and stores the chosen callable under that key. Anything the table does not
cover goes to the op's fallback, which keeps the plain PyTorch semantics.
Dict reads and writes are atomic under the GIL, so many threads may dispatch at
once; a race only resolves the same key twice, to the same answer.
"""
from __future__ import annotations

import inspect
import itertools
import threading
import warnings
import weakref
from collections import Counter
from typing import NamedTuple

import torch

from . import registry
from .hardware import device_info
from .ops import OPS, OpSchema, example_args, register_op
from .table import Leaf, Split, Table, TableError, choose, leaves

MAX_CACHED_KEYS = 8192  # per method; past this, new keys are resolved per call instead of cached

# runtime_loader.record: while a recording is active, no call is cached, so every call reaches
# _resolve and is counted there (caches are cleared when it starts)
_recording = None
_live: weakref.WeakSet = weakref.WeakSet()


def start_recording(recording) -> None:
    global _recording
    if _recording is not None:
        raise RuntimeError("runtime_loader.record is already recording; recordings do not nest")
    _recording = recording
    for dispatcher in list(_live):
        dispatcher.clear_cache()


def stop_recording() -> None:
    global _recording
    _recording = None


class Entry(NamedTuple):
    """What a call key resolved to. calls is an itertools.count: next() on it is one C call,
    atomic under the GIL, so counting costs tens of nanoseconds and no lock on the hot path."""
    impl: object
    calls: itertools.count
    op: str
    kernel_id: str
    from_table: bool


def _count(entry: Entry) -> int:
    """Calls counted so far (count(n) holds its next value in its repr; next() would take one)."""
    return int(repr(entry.calls)[6:-1])


def _stale(kernel_id: str, measured: dict) -> str | None:
    """Why the kernel here is not the kernel that was measured, if it is not."""
    spec = registry.get(kernel_id)
    if spec.version() != measured.get("version"):
        return f"{spec.library} is {spec.version()} here, the table measured {measured.get('version')}"
    if spec.capabilities_hash() != measured.get("capabilities"):
        return "its declared capabilities changed since the table was solved"
    return None


class Dispatcher:
    """Serves every op of runtime_loader.ops.OPS through a method named by its record (attention,
    rms_norm, ...), generated at the end of this module from the record's parameters."""

    def __init__(self, table: Table | None = None):
        self.table = table
        self.device_type = table.hardware["device"] if table else None
        self._on_cuda = self.device_type == "cuda"
        self._trees: dict[str, Leaf | Split] = {}
        self._usable: set[str] = set()
        # one cache per method (both attention ops share one): key -> Entry
        self._caches: dict[str, dict] = {op.method: {} for op in OPS.values()}
        # calls that are not cached (past MAX_CACHED_KEYS, or while recording) count here, by
        # (op, kernel, from table); counts of cleared cache entries are kept in _retired
        self._uncached: dict[tuple, Entry] = {}
        self._retired: Counter = Counter()
        self._stats_lock = threading.Lock()
        _live.add(self)
        if table is None:
            return
        here = device_info("cuda" if self._on_cuda else "cpu")
        for sig, tree in table.trees.items():
            self._trees[str(sig)] = tree
        for kernel_id in sorted({leaf.kernel_id for tree in table.trees.values() for leaf in leaves(tree)}):
            local = registry.get(kernel_id).local_reasons(here)
            why = str(local[0]) if local else _stale(kernel_id, table.kernels[kernel_id])
            if why:
                warnings.warn(f"lzsolve: {kernel_id} is not used ({why}); its table entries use the fallback",
                              RuntimeWarning, stacklevel=3)
            else:
                self._usable.add(kernel_id)

    # --- resolution (first call of a key) ------------------------------------
    def _resolve(self, cache: dict, key: tuple, call, op: OpSchema, kernel_args: tuple) -> Entry:
        """call: the call's (signature, dims), None for a call no signature describes (then served
        by op.outside, or the fallback); op: the method's first op, named in stats() for such calls."""
        if call is None:
            spec = registry.get(op.outside(*kernel_args) if op.outside else op.fallback)
        else:
            spec = registry.fallback_for(call[0])
        on_cuda = any(getattr(a, "is_cuda", False) for a in kernel_args)
        from_table = False
        if call is not None and on_cuda == self._on_cuda:
            sig, dims = call
            tree = self._trees.get(str(sig))
            if tree is not None:
                kernel_id = choose(tree, dims)
                if kernel_id in self._usable:
                    spec, from_table = registry.get(kernel_id), True
        name = call[0].op if call is not None else op.name
        recording = _recording
        if recording is not None:
            recording.count(call, spec, from_table)
        elif len(cache) < MAX_CACHED_KEYS:
            entry = cache[key] = Entry(spec.impl, itertools.count(), name, spec.kernel_id, from_table)
            return entry
        with self._stats_lock:
            return self._uncached.setdefault((name, spec.kernel_id, from_table),
                                             Entry(spec.impl, itertools.count(), name, spec.kernel_id, from_table))

    def _entry(self, method: str, args: tuple, kwargs: dict) -> Entry:
        """The Entry a call of `method` resolves to, without calling it."""
        op = METHOD_OPS[method]
        key, kernel_args = op.front(*args, **kwargs)
        cache = self._caches[method]
        return cache.get(key) or self._resolve(cache, key, op.call(*args, **kwargs), op, kernel_args)

    def clear_cache(self) -> None:
        with self._stats_lock:
            for cache in self._caches.values():
                for entry in list(cache.values()):
                    self._retired[(entry.op, entry.kernel_id, entry.from_table)] += _count(entry)
                cache.clear()

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls since this dispatcher was made, per op and per kernel that served them:
        {"norm.rms": {"triton.rms_norm[...]": 96, ...}, ...}; a kernel the table did not choose
        (the call was outside the table, or its kernel is unusable here) is marked
        " (fallback)". Cheap: counts are kept per call key and summed here."""
        with self._stats_lock:
            totals = Counter(self._retired)
            entries = [e for cache in self._caches.values() for e in list(cache.values())]
            entries += list(self._uncached.values())
        for e in entries:
            totals[(e.op, e.kernel_id, e.from_table)] += _count(e)
        out: dict[str, dict[str, int]] = {}
        for (op, kernel_id, from_table), n in sorted(totals.items()):
            if n:
                out.setdefault(op, {})[kernel_id if from_table else f"{kernel_id} (fallback)"] = n
        return out

    def cached_keys(self) -> int:
        return sum(len(cache) for cache in self._caches.values())

    def kernel_for(self, method: str, *args, **kwargs) -> str:
        """The kernel id a call of `method` ('attention', 'rms_norm', ...) with these args would use."""
        return self._entry(method, args, kwargs).kernel_id

    def warmup(self, strict: bool = False) -> int:
        """Call every table entry once (the smallest and largest grid point each leaf serves),
        so JIT compilation happens now rather than in a server's first request. A kernel that
        raises is dropped to the fallback with a warning (or TableError when strict).
        Returns the number of calls made."""
        if self.table is None:
            return 0
        device = torch.device("cuda" if self._on_cuda else "cpu")
        calls = 0
        for sig, tree in self.table.trees.items():
            grid = self.table.raw["buckets"].get(sig.op, {})
            points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
            by_leaf: dict[str, list[dict]] = {}
            for dims in points:
                by_leaf.setdefault(choose(tree, dims), []).append(dims)
            for kernel_id, served in by_leaf.items():
                if kernel_id not in self._usable:
                    continue
                for dims in {0: served[0], 1: served[-1]}.values() if len(served) > 1 else served:
                    try:
                        getattr(self, OPS[sig.op].method)(*example_args(sig, dims, device))
                        calls += 1
                    except Exception as e:
                        if strict:
                            raise TableError(f"warm-up of {kernel_id} on {sig} at {dims} failed: {e}") from e
                        warnings.warn(f"lzsolve: {kernel_id} failed its warm-up on {sig} ({type(e).__name__}: {e}); "
                                      "its table entries use the fallback", RuntimeWarning, stacklevel=2)
                        self._usable.discard(kernel_id)
                        self.clear_cache()
                        break
        if self._on_cuda:
            torch.cuda.synchronize()
        return calls


# --- the public methods, one per OpSchema.method --------------------------------------------------
# The hot path: the op's front (one tuple for the key, one for the kernel's args), one dict read,
# one count, the kernel. Generated from the records so that every op is served the same way.
METHOD_OPS: dict[str, OpSchema] = {}  # method -> its first op (attention: attention.prefill)


# The method is compiled from a template with the front's own parameter list, as dataclasses and
# namedtuple build __init__: Python binds the arguments (keywords and defaults included) in C, where a
# generic (*args, **kwargs) wrapper cost 0.1-0.5 us per call. Only the records' parameter names (checked
# to be identifiers) enter the source; defaults are passed in as objects.
METHOD_TEMPLATE = """
def {name}(self, {params}):
    key, kernel_args = front({args})
    cache = self._caches[{name!r}]
    entry = cache.get(key) or self._resolve(cache, key, call({args}), op, kernel_args)
    next(entry.calls)
    return entry.impl(*kernel_args)
"""


def _method(op: OpSchema):
    parameters = op.parameters
    if not all(p.name.isidentifier() and p.kind == p.POSITIONAL_OR_KEYWORD for p in parameters):
        raise ValueError(f"{op.name}: a front takes named parameters only, got {inspect.signature(op.front)}")
    defaults = {f"_default_{p.name}": p.default for p in parameters if p.default is not p.empty}
    params = ", ".join(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}" for p in parameters)
    source = METHOD_TEMPLATE.format(name=op.method, params=params, args=", ".join(p.name for p in parameters))
    namespace = {"front": op.front, "call": op.call, "op": op, **defaults}
    exec(source, namespace)  # noqa: S102 - our own records' names, never an artifact's
    method = namespace[op.method]
    method.__qualname__ = f"Dispatcher.{op.method}"
    method.__doc__, method.__annotations__ = op.front.__doc__, dict(op.front.__annotations__)
    return method


def serve_op(op: OpSchema) -> None:
    """Give the Dispatcher a method for `op` (one per method name: ops sharing one share its cache)."""
    Dispatcher.METHODS[op.name] = op.method
    if op.method in METHOD_OPS:
        return
    if hasattr(Dispatcher, op.method):
        raise ValueError(f"op {op.name}: Dispatcher.{op.method} already exists and is not an op")
    METHOD_OPS[op.method] = op
    setattr(Dispatcher, op.method, _method(op))
    for dispatcher in list(_live):  # dispatchers made before the op was added
        dispatcher._caches.setdefault(op.method, {})


def add_op(op: OpSchema) -> OpSchema:
    """A new op, served like the built-in ones: its record known to signatures and the registry
    (runtime_loader.ops.register_op), its Dispatcher method and its torch.ops.lzsolve custom op.
    A plugin adds its ops with this, its contracts with lzsolve.ops.register_contract and its
    kernels with runtime_loader.registry.register (see CONTRIBUTING.md)."""
    from .custom_ops import define  # custom_ops imports this module

    register_op(op)
    serve_op(op)
    define(op)
    return op


Dispatcher.METHODS = {}  # op -> the method that serves it (attention.prefill -> attention)
for _op in OPS.values():
    serve_op(_op)
