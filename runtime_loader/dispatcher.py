"""The Dispatcher: replays a dispatch table with a dict lookup per call.

A call's key is built from shapes, dtype and device kind (no allocation, no
formatting); the first call with a new key derives the op signature, walks the
tree and stores the chosen callable under that key. Anything the table does not
cover goes to the op's fallback, which keeps the plain PyTorch semantics.
Dict reads and writes are atomic under the GIL, so many threads may dispatch at
once; a race only resolves the same key twice, to the same answer.
"""
from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from collections import Counter
from typing import NamedTuple

import torch

from . import registry
from .hardware import device_info
from .ops import (OPS, attention_call, embedding_call, example_args, gated_deltanet_call, linear_call, qk_norm_call,
                  rope_call, rows_call)
from .table import Leaf, Split, Table, TableError, choose, leaves

MAX_CACHED_KEYS = 8192  # per op; past this, new keys are resolved per call instead of cached
UNIT_OFFSET, NO_BIAS = ("unit_offset",), ("no_bias",)

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
    def __init__(self, table: Table | None = None):
        self.table = table
        self.device_type = table.hardware["device"] if table else None
        self._on_cuda = self.device_type == "cuda"
        self._trees: dict[str, Leaf | Split] = {}
        self._usable: set[str] = set()
        # one cache per op (both attention ops share one): key -> Entry
        self._caches: dict[str, dict] = {op: {} for op in OPS if op != "attention.decode"}
        self._caches["attention.decode"] = self._caches["attention.prefill"]
        self._attention, self._rope, self._linear, self._qk_norm, self._embedding, self._deltanet = (
            self._caches[op] for op in ("attention.prefill", "posenc.rope", "linear", "norm.qk", "embedding",
                                        "recurrent.gated_deltanet"))
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
    def _resolve(self, cache: dict, key: tuple, call, outside: str, on_cuda: bool, op: str) -> Entry:
        """outside: the kernel id for a call that no signature describes; op: its op for stats()."""
        spec = registry.get(outside) if call is None else registry.fallback_for(call[0])
        from_table = False
        if call is not None and on_cuda == self._on_cuda:
            sig, dims = call
            tree = self._trees.get(str(sig))
            if tree is not None:
                kernel_id = choose(tree, dims)
                if kernel_id in self._usable:
                    spec, from_table = registry.get(kernel_id), True
        op = call[0].op if call is not None else op
        recording = _recording
        if recording is not None:
            recording.count(call, spec, from_table)
        elif len(cache) < MAX_CACHED_KEYS:
            entry = cache[key] = Entry(spec.impl, itertools.count(), op, spec.kernel_id, from_table)
            return entry
        with self._stats_lock:
            return self._uncached.setdefault((op, spec.kernel_id, from_table),
                                             Entry(spec.impl, itertools.count(), op, spec.kernel_id, from_table))

    # --- lookups: the Entry for a call ---------------------------------------------
    # The hot path: one tuple, one dict read, one count. Keys hold every argument that changes the
    # signature (flags, window, softcap). Keys use is_cuda, not device.type (which
    # builds an object per call); attention keys on v.shape, not k.shape: a valid SDPA
    # call has k.shape == v.shape but for the last dim, which must equal q's.
    def _attention_entry(self, q, k, v, causal, window, softcap, qk_norm):
        key = (q.shape, v.shape, q.dtype, q.is_cuda, causal, window, softcap, qk_norm)
        # a call outside the signatures (chunked prefill) goes to SDPA, or to the reference where SDPA cannot softcap
        return self._attention.get(key) or self._resolve(
            self._attention, key, attention_call(q, k, v, causal, window, softcap, qk_norm),
            OPS["attention.prefill"].reference if softcap else OPS["attention.prefill"].fallback, q.is_cuda,
            "attention.prefill")

    def _rows_entry(self, op: str, x, flags: tuple[str, ...] = ()):
        """Norms, activations, learned positions: keyed on the shape of their first input (and the norm's flag)."""
        cache = self._caches[op]
        key = (x.shape, x.dtype, x.is_cuda, flags)
        return cache.get(key) or self._resolve(cache, key, rows_call(op, x, flags), OPS[op].fallback, x.is_cuda, op)

    def _qk_norm_entry(self, x, unit_offset):
        key = (x.shape, x.dtype, x.is_cuda, unit_offset)
        return self._qk_norm.get(key) or self._resolve(
            self._qk_norm, key, qk_norm_call(x, unit_offset), OPS["norm.qk"].fallback, x.is_cuda, "norm.qk")

    def _embedding_entry(self, ids, table, scale):
        key = (ids.shape, ids.dtype, table.shape, table.dtype, table.is_cuda, scale is None)
        return self._embedding.get(key) or self._resolve(
            self._embedding, key, embedding_call(ids, table, scale), OPS["embedding"].fallback, table.is_cuda,
            "embedding")

    def _rope_entry(self, q, k, interleaved):
        key = (q.shape, k.shape, q.dtype, q.is_cuda, interleaved)
        return self._rope.get(key) or self._resolve(
            self._rope, key, rope_call(q, k, interleaved), OPS["posenc.rope"].fallback, q.is_cuda, "posenc.rope")

    def _linear_entry(self, x, weight, bias):
        key = (x.shape, weight.shape, bias is None, x.dtype, x.is_cuda)
        return self._linear.get(key) or self._resolve(
            self._linear, key, linear_call(x, weight, bias), OPS["linear"].fallback, x.is_cuda, "linear")

    def _deltanet_entry(self, q, v, qk_l2norm):
        key = (q.shape, v.shape, q.dtype, q.is_cuda, qk_l2norm)
        return self._deltanet.get(key) or self._resolve(
            self._deltanet, key, gated_deltanet_call(q, v, qk_l2norm), OPS["recurrent.gated_deltanet"].fallback,
            q.is_cuda, "recurrent.gated_deltanet")

    @staticmethod
    def _run(entry: Entry, *args):
        next(entry.calls)
        return entry.impl(*args)

    # --- the public ops ----------------------------------------------------------
    # Options a model seldom sets (window, softcap, unit_offset) reach a kernel only when set,
    # so kernels that do not declare them keep their plain call.
    def attention(self, q, k, v, causal: bool = True, scale: float | None = None, window: int = 0,
                  softcap: float = 0.0, qk_norm: bool = False):
        """SDPA semantics, layout (batch, heads, seq, head_dim); GQA when kv heads divide q heads.
        window: a query at position p sees keys j > p - window, where p is i for query i under a
        causal mask and kv_len - seq_q + i without one (a decode query is the newest token);
        softcap: scaled scores become softcap * tanh(scores / softcap) before the mask (Gemma 2);
        qk_norm: q and k come from a per-head norm (no change to the math, only to which kernels
        may serve the call)."""
        entry = self._attention_entry(q, k, v, causal, window, softcap, qk_norm)
        if window or softcap:
            return self._run(entry, q, k, v, causal, scale, window, softcap)
        return self._run(entry, q, k, v, causal, scale)

    def rms_norm(self, x, weight, eps: float = 1e-6, unit_offset: bool = False):
        """x / rms(x) * weight; unit_offset: * (1 + weight) in fp32, rounded once (Gemma, Qwen3.5)."""
        entry = self._rows_entry("norm.rms", x, UNIT_OFFSET if unit_offset else ())
        return self._run(entry, x, weight, eps, True) if unit_offset else self._run(entry, x, weight, eps)

    def rms_norm_add(self, x, residual, weight, eps: float = 1e-6, unit_offset: bool = False):
        """(rms_norm(x + residual) * weight, x + residual), the fused residual add of a pre-norm
        block. x and residual are consumed: a kernel may write the results into their storage."""
        entry = self._rows_entry("norm.rms_add", x, UNIT_OFFSET if unit_offset else ())
        return (self._run(entry, x, residual, weight, eps, True) if unit_offset
                else self._run(entry, x, residual, weight, eps))

    def qk_norm(self, x, weight, eps: float = 1e-6, unit_offset: bool = False):
        """rms_norm of each head of x (..., heads, d) with one weight (d,) (Qwen3's q_norm, k_norm)."""
        entry = self._qk_norm_entry(x, unit_offset)
        return self._run(entry, x, weight, eps, True) if unit_offset else self._run(entry, x, weight, eps)

    def layer_norm(self, x, weight, bias, eps: float = 1e-5):
        """bias None: a LayerNorm without a bias (its own signature, flag no_bias)."""
        return self._run(self._rows_entry("norm.layer", x, NO_BIAS if bias is None else ()), x, weight, bias, eps)

    def embedding(self, ids, table, scale: float | None = None):
        """table[ids] (ids int64), times scale rounded to the table's dtype when given (Gemma's sqrt(hidden))."""
        return self._run(self._embedding_entry(ids, table, scale), ids, table, scale)

    def rope(self, q, k, cos, sin, interleaved: bool = False):
        """Rotary embedding of q (batch, hq, seq, d) and k (batch, hkv, seq, d) with cos/sin
        of shape (batch or 1, seq, d) as Hugging Face builds them; returns (q, k)."""
        return self._run(self._rope_entry(q, k, interleaved), q, k, cos, sin, interleaved)

    def learned_positions(self, x, positions, table):
        """x + table[positions] (GPT-2's wpe); positions broadcast against x's leading dims."""
        return self._run(self._rows_entry("posenc.learned", x), x, positions, table)

    def swiglu(self, gate, up):
        """silu(gate) * up."""
        return self._run(self._rows_entry("act.swiglu", gate), gate, up)

    def geglu(self, gate, up):
        """gelu(gate, approximate="tanh") * up (Gemma's gelu_pytorch_tanh)."""
        return self._run(self._rows_entry("act.geglu", gate), gate, up)

    def gelu(self, x):
        """gelu(x, approximate="tanh") (GPT-2's gelu_new)."""
        return self._run(self._rows_entry("act.gelu", x), x)

    def sigmoid_gate(self, x, gate):
        """x * sigmoid(gate) (Qwen3.5's gated attention output)."""
        return self._run(self._rows_entry("act.sigmoid_gate", x), x, gate)

    def linear(self, x, weight, bias=None):
        return self._run(self._linear_entry(x, weight, bias), x, weight, bias)

    def gated_deltanet(self, q, k, v, g, beta, state=None, qk_l2norm: bool = True):
        """Qwen3.5's Gated DeltaNet: q, k (batch, seq, hk, dk), v (batch, seq, hv, dv), g (log
        decay) and beta (batch, seq, hv), state (batch, hv, dk, dv) or None; returns (out, final
        fp32 state). See lzsolve.ops.recurrent for the conventions."""
        return self._run(self._deltanet_entry(q, v, qk_l2norm), q, k, v, g, beta, state, qk_l2norm)

    def clear_cache(self) -> None:
        with self._stats_lock:
            for op, cache in self._caches.items():
                if op != "attention.decode":
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
            entries = [e for op, cache in self._caches.items() if op != "attention.decode" for e in list(cache.values())]
            entries += list(self._uncached.values())
        for e in entries:
            totals[(e.op, e.kernel_id, e.from_table)] += _count(e)
        out: dict[str, dict[str, int]] = {}
        for (op, kernel_id, from_table), n in sorted(totals.items()):
            if n:
                out.setdefault(op, {})[kernel_id if from_table else f"{kernel_id} (fallback)"] = n
        return out

    def cached_keys(self) -> int:
        return sum(len(cache) for op, cache in self._caches.items() if op != "attention.decode")

    METHODS = {"attention.prefill": "attention", "attention.decode": "attention", "norm.rms": "rms_norm",
               "norm.rms_add": "rms_norm_add", "norm.qk": "qk_norm", "norm.layer": "layer_norm",
               "embedding": "embedding", "posenc.rope": "rope", "posenc.learned": "learned_positions",
               "act.swiglu": "swiglu", "act.geglu": "geglu", "act.gelu": "gelu", "act.sigmoid_gate": "sigmoid_gate",
               "linear": "linear", "recurrent.gated_deltanet": "gated_deltanet"}
    # methods whose kernel their first argument alone decides
    ROW_OPS = {method: op for op, method in METHODS.items()
               if op in ("posenc.learned", "act.swiglu", "act.geglu", "act.gelu", "act.sigmoid_gate")}

    def kernel_for(self, op: str, *args, **kwargs) -> str:
        """The kernel id a call of `op` ('attention', 'rms_norm', ...) with these args would use."""
        if op in self.ROW_OPS:
            return self._rows_entry(self.ROW_OPS[op], args[0]).kernel_id
        lookups = {  # each mirrors its method's parameters
            "attention": lambda q, k, v, causal=True, scale=None, window=0, softcap=0.0, qk_norm=False:
                self._attention_entry(q, k, v, causal, window, softcap, qk_norm),
            "rms_norm": lambda x, weight, eps=None, unit_offset=False:
                self._rows_entry("norm.rms", x, UNIT_OFFSET if unit_offset else ()),
            "rms_norm_add": lambda x, residual, weight, eps=None, unit_offset=False:
                self._rows_entry("norm.rms_add", x, UNIT_OFFSET if unit_offset else ()),
            "layer_norm": lambda x, weight, bias, eps=None: self._rows_entry("norm.layer", x, NO_BIAS if bias is None else ()),
            "qk_norm": lambda x, weight, eps=None, unit_offset=False: self._qk_norm_entry(x, unit_offset),
            "embedding": lambda ids, table, scale=None: self._embedding_entry(ids, table, scale),
            "rope": lambda q, k, cos, sin, interleaved=False: self._rope_entry(q, k, interleaved),
            "linear": lambda x, weight, bias=None: self._linear_entry(x, weight, bias),
            "gated_deltanet": lambda q, k, v, g, beta, state=None, qk_l2norm=True: self._deltanet_entry(q, v, qk_l2norm),
        }
        return lookups[op](*args, **kwargs).kernel_id

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
                        getattr(self, self.METHODS[sig.op])(*example_args(sig, dims, device))
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
