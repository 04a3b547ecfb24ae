"""The Dispatcher: replays a dispatch table with a dict lookup per call.

A call's key is built from shapes, dtype and device kind (no allocation, no
formatting); the first call with a new key derives the op signature, walks the
tree and stores the chosen callable under that key. Anything the table does not
cover goes to the op's fallback, which keeps the plain PyTorch semantics.
Dict reads and writes are atomic under the GIL, so many threads may dispatch at
once; a race only resolves the same key twice, to the same answer.
"""
from __future__ import annotations

import ast
import functools
import inspect
import itertools
import logging
import textwrap
import threading
import time
import types
import weakref
from collections import Counter
from typing import NamedTuple

import torch

from . import registry
from .hardware import device_info, differences, hardware_signature, stale_under
from .ops import OPS, OpSchema, Signature, example_args
from .parity import TOLERANCES, Tolerance, compare
from .policies import Policy, lock_problem
from .safeio import warn
from .table import Leaf, Split, Table, TableError, leaf_for, leaf_kernels, leaves, tuned_range

MAX_CACHED_KEYS = 8192  # per method; past this, new keys are resolved per call instead of cached
BREAKER_LIMIT = 3  # failures after which a kernel is dropped for every call key, not only the failing ones
# why a call is not the table's where the table's choice there is the op's fallback: a patched module
# hands it back to its own code (the same computation, without the table's lookup)
CHOSE_FALLBACK = "the table's choice is the fallback"
# Under patch(traced=True, fuse=True) an op Inductor fuses with its neighbours takes its fallback
# (Dispatcher._inductor_fuses), so no call of it is the table's: a module patched for it only added Dynamo guards
# (a tiny Llama's compiled forward: 1167 against the unpatched model's 889, the same 91 graph
# nodes), and the compiled models whose tables served such ops ran 0.93-0.98x of compile alone
# (benchmarks/runs/2026-12-06-h.txt); with those modules left, 0.99-1.05x (2026-12-06-i.txt)
TRACED_FUSIBLE = "compiled with patch(traced=True), Inductor fuses the module's own code with its neighbours"
PAST_RANGE = "past the tuned range"  # why a call beyond PAST_GRID times its op's largest bucket takes the fallback
# why a call with a dynamic dim of 0 (0 tokens, kv_len 0, batch 0) takes the fallback, a lock too: no table kernel
# was measured there (buckets start at 1), and some die on it where eager torch and SDPA return an empty result
# (torch's CPU flash attention on seq 0 kills the process with SIGFPE, which no except can catch)
EMPTY_INPUT = "an empty input"
VERIFY_BUDGET_S = 60.0  # load(verify=True): seconds its parity checks may take before the rest are dropped
log = logging.getLogger("runtime_loader")

# runtime_loader.record: the recording active, if any. Caches are cleared when it starts, so every
# call key resolves again and the recording tracks each entry's counter (Recording.track), read when it
# stops; entries made while recording never hand a call back (a recording counts what the table
# decided, its fallback included), so caches are cleared again when it stops.
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
    recording, _recording = _recording, None
    if recording is not None:
        recording.flush()
    for dispatcher in list(_live):
        dispatcher.clear_cache()


class NotServed:
    """What the methods of Dispatcher.served return for a call the table does not serve. `calls` is
    the counter of the entry that handed it back (None where there is none), so that a caller which
    remembers the call's shape (Dispatcher.own_calls_memo) can count its later calls there without
    the table's lookup."""

    __slots__ = ("calls",)

    def __init__(self, calls: itertools.count | None = None):
        self.calls = calls

    def __repr__(self) -> str:
        return "NOT_SERVED"


# A patched module calls the table through Dispatcher.served and, on a NotServed, runs its own
# forward: the code the unpatched model ran, where the op's fallback is another formulation of it
# (a mask built per call, a norm in another order) and cost a patched model up to 0.6x its speed.
NOT_SERVED = NotServed()
OWN_CODE = "own code"  # stats(): calls handed back to their caller's own code (Dispatcher.served)
# why a patched module's call runs its own code before the table is asked (Dispatcher.hand_back): autograd records
# it (grad mode on, a tensor it reads requiring grad), and the table's kernels have no backward
AUTOGRAD = "autograd records it: the table's kernels are forward-only"
# or it runs under torch.autocast, which casts what the module's own code calls op by op (a GEMM to
# bf16), where a table's kernel computes in the dtypes it is handed
AUTOCAST = "under autocast: the module's own code, as autocast casts it"
MAX_MEMO_SHAPES = 1024  # per caller's memo (own_calls_memo): past this, new shapes go through the table


class _OwnMemo(dict):
    """Dispatcher.own_calls_memo's memo. A deep copy of it (a patched model copied) is a new, empty memo
    of the same Dispatcher: a copied one would count the copy's calls on copies of the entries' counters,
    which neither stats() nor a recording reads, and which clear_cache would never forget."""

    __slots__ = ("new",)

    def __deepcopy__(self, memo):
        return self.new()


def _hand_back(*args):
    return NOT_SERVED


def _handing_back(calls: itertools.count):
    """A hand-back entry's impl: the NotServed that names its counter."""
    marker = NotServed(calls)
    return lambda *args: marker


class Entry(NamedTuple):
    """What a call key resolved to. calls is an itertools.count: next() on it is one C call,
    atomic under the GIL, so counting costs tens of nanoseconds and no lock on the hot path."""
    impl: object
    calls: itertools.count
    op: str
    kernel_id: str
    from_table: bool
    sig: str | None = None  # the call's signature (None: no signature describes it)
    why: str = ""  # why it is served as it is (Dispatcher._pick's reason)

    @property
    def tally(self) -> tuple:
        """What its calls are counted under: (op, kernel, from the table, signature, why)."""
        return self.op, self.kernel_id, self.from_table, self.sig, self.why


def _any_cuda(kernel_args: tuple) -> bool:
    return any(getattr(a, "is_cuda", False) for a in kernel_args)


def counted(calls: itertools.count) -> int:
    """Calls counted so far on an entry's counter (count(n) holds its next value in its repr; next()
    would take one)."""
    return int(repr(calls)[6:-1])


def _call_restoring(impl, args: tuple, op: OpSchema):
    """impl(*args), putting back what it overwrote of the inputs `op` consumes if it raises
    (no copies inside a CUDA graph being captured: they would be replayed with it)."""
    if args and getattr(args[0], "is_cuda", False) and torch.cuda.is_current_stream_capturing():
        return impl(*args)
    positions = op.consumed(args)
    saved = [(args[i], args[i].clone()) for i in positions if isinstance(args[i], torch.Tensor)]  # a state may be None
    try:
        return impl(*args)
    except Exception:
        for tensor, copy in saved:
            tensor.copy_(copy)
        raise


def _path(node: Leaf | Split, dims: dict) -> list[str]:
    """The conditions a tree tests on its way to the leaf for `dims` ("tokens <= 8")."""
    path = []
    while isinstance(node, Split):
        below = dims[node.dim] <= node.threshold
        path.append(f"{node.dim} {'<=' if below else '>'} {node.threshold:g}")
        node = node.le if below else node.gt
    return path


def _stale(kernel_id: str, measured: dict, stack: dict) -> str | None:
    """Why the kernel here is not the kernel that was measured, if it is not: its library or our
    adapter changed (its version), its declared capabilities, or software it runs on (`stack`:
    hardware.Comparison.stack)."""
    spec = registry.get(kernel_id)
    if spec.version() != measured.get("version"):
        return f"{spec.library} is {spec.version()} here, the table measured {measured.get('version')}"
    if spec.capabilities_hash() != measured.get("capabilities"):
        return "its declared capabilities changed since the table was solved"
    return stale_under(spec, stack)


def _disagreement(sig: Signature, dims: dict, kernel_id: str, device: torch.device) -> str | None:
    """Why `kernel_id`'s output for `sig` at `dims` is not its op's fallback's (within twice the
    tune's tolerance), if it is not: both called on the same random inputs, drawn afresh for each
    (a kernel may write over what its op consumes)."""
    def inputs() -> tuple:
        return OPS[sig.op].inputs(sig, dims, device, torch.Generator(device=device).manual_seed(0))

    try:
        with torch.no_grad():
            got = registry.get(kernel_id).impl(*inputs())
            expected = registry.fallback_for(sig).impl(*inputs())
    except Exception as e:  # noqa: BLE001 - a kernel that raises is not trusted
        return f"RAISED at verify on {sig} at {dims}: {type(e).__name__}: {str(e)[:200]}"
    tolerance = TOLERANCES[sig.dtype]
    ok, _, message = compare(got, expected, Tolerance(2 * tolerance.rel_l2, 2 * tolerance.max_rel))
    return None if ok else f"PARITY_FAILED at verify on {sig} at {dims}: {message}"


def _past(limits: dict[str, float], dims: dict) -> str | None:
    """Why a call at `dims` is outside the range its table was checked over, if it is."""
    for dim, limit in limits.items():
        if dims.get(dim, 0) > limit:
            return f"{PAST_RANGE} ({dim}={dims[dim]} > {limit:g})"
    return None


class Dispatcher:
    """Serves every op of runtime_loader.ops.OPS through a method named by its record (attention,
    rms_norm, ...), generated at the end of this module from the record's parameters.

    strict=False (the default): a table kernel that raises is a broken kernel, not the caller's
    error: the call is served again by the leaf's next ranked kernel or the fallback, that call
    key keeps using it, and after BREAKER_LIMIT failures the kernel is dropped for every key
    (counted in stats(), warned once). strict=True lets the exception through."""

    def __init__(self, table: Table | None = None, *, strict: bool = False, policy: Policy | None = None,
                 load_error: str | None = None, stack: dict | None = None):
        """load_error: why load() has no table for this dispatcher (its warning), for patch's report
        and explain(); stack: the software that changed since the table was measured
        (hardware.Comparison.stack; by default compared here)."""
        self.table = table
        self.strict = strict
        self.policy = policy if policy is not None else Policy()
        self.load_error = load_error
        # under torch.compile, integrations call this Dispatcher's methods rather than the opaque
        # torch.ops.lzsolve custom ops: Dynamo traces the table's choice (its thresholds become guards)
        # and the kernel's own torch ops, which Inductor may fuse with the model's (patch(traced=True))
        self.traced = False
        # traced: calls of ops whose fallback Inductor fuses with its neighbours (OpSchema.fusible) take
        # that fallback, unless locked: the table's kernel for them (one launch Inductor cannot fuse
        # into) left a compiled model 6-16% slower than compile alone, the torch form up to 5% (benchmarks/hf_end_to_end.py)
        self.traced_fuse = True
        self.device_type = table.hardware["device"] if table else None
        self._on_cuda = self.device_type == "cuda"
        self._trees: dict[str, Leaf | Split] = {}
        self._usable: set[str] = set()  # kernels of the table (chosen or ranked) that may serve here
        self._locks: dict[str, str] = {}  # op -> kernel id, the policy's locks that can be honoured here
        # one cache per method (both attention ops share one): key -> Entry; the methods of
        # self.served keep theirs apart (a call the table does not serve resolves to NOT_SERVED there)
        self._caches: dict[str, dict] = {op.method: {} for op in OPS.values()}
        self._served_caches: dict[str, dict] = {op.method: {} for op in OPS.values()}
        self._own_memos: list[dict] = []  # own_calls_memo's, cleared with the caches
        self.served = _Served(self)
        # the methods again, resolved without caches or counts: what Dynamo traces (traced_call)
        self.traced_ops = types.SimpleNamespace(**{m: functools.partial(self.traced_call, m) for m in self._caches})
        self.traced_served = types.SimpleNamespace(**{m: functools.partial(self.traced_served_call, m)
                                                      for m in self._caches})
        self._limits: dict[str, dict[str, float]] = {}  # op -> dim -> the largest value the table was checked at
        self._unusable: dict[str, str] = {}  # kernel of the table -> why it does not serve here
        self._verified: set[tuple[str, str]] = set()  # (kernel, signature) verify() checked
        # calls that are not cached (past MAX_CACHED_KEYS, or while recording) count here, by
        # (op, kernel, from table); counts of cleared cache entries are kept in _retired
        self._uncached: dict[tuple, Entry] = {}
        self._retired: Counter = Counter()
        self._stats_lock = threading.Lock()
        # the circuit breaker: kernels that raised, per (method, key), and in all; failed calls by (op, kernel)
        self._broken: dict[tuple, frozenset] = {}
        self._failures: Counter = Counter()
        self._failed_calls: Counter = Counter()
        self._dropped: set[str] = set()  # kernels used for no call any more (BREAKER_LIMIT failures, warm-up)
        self._warned: set = set()
        _live.add(self)
        # a dispatcher without a table (policy alone) serves calls on any device: its locks are
        # checked against the GPU where there is one
        here = device_info("cuda" if self._on_cuda or (table is None and torch.cuda.is_available()) else "cpu")
        self._apply_locks(here)
        if table is None:
            return
        if stack is None:
            stack = differences(table.hardware, hardware_signature(here.type)).stack
        for sig, tree in table.trees.items():
            self._trees[str(sig)] = tree
        self._limits = tuned_range(table.raw.get("buckets", {}))
        chosen = {leaf.kernel_id for tree in table.trees.values() for leaf in leaves(tree)}
        served = {k for tree in table.trees.values() for leaf in leaves(tree) for k in leaf_kernels(leaf)}
        for kernel_id in sorted(served):
            # no import here (a start in well under a second): a library that is installed but does
            # not import fails the kernel's first call, and the circuit breaker serves it instead
            local = registry.get(kernel_id).local_reasons(here, load=False)
            why = str(local[0]) if local else _stale(kernel_id, table.kernels[kernel_id], stack)
            if why:
                self._unusable[kernel_id] = why
            elif self.policy.avoids(kernel_id):
                self._unusable[kernel_id] = f"policy: avoid {registry.get(kernel_id).library}"
            else:
                self._usable.add(kernel_id)
        self._warn_unusable(sorted(k for k in chosen if k in self._unusable and not self.policy.avoids(k)))

    def _warn_unusable(self, kernel_ids: list[str]) -> None:
        """One warning for the table's chosen kernels that cannot serve here (installed, stale)."""
        if not kernel_ids:
            return
        if len(kernel_ids) == 1:
            what = f"{kernel_ids[0]} is not used ({self._unusable[kernel_ids[0]]}); its table entries use"
        else:
            named = "; ".join(f"{k} ({self._unusable[k]})" for k in kernel_ids[:3])
            more = f"; and {len(kernel_ids) - 3} more" if len(kernel_ids) > 3 else ""
            what = f"{len(kernel_ids)} kernels of the table are not used here: {named}{more}; their entries use"
        warn(f"lzsolve: {what} the next ranked kernel or the fallback (d.explain() lists each "
             "entry)", stacklevel=4)

    @property
    def locks(self) -> dict[str, str]:
        """op -> kernel id: the policy's locks this dispatcher honours."""
        return dict(self._locks)

    def _apply_locks(self, here) -> None:
        """Keep the policy's locks this runtime can honour; log the policy once."""
        for op, kernel_id in sorted(self.policy.lock.items()):
            why = lock_problem(op, kernel_id, here)
            if why is None:
                self._locks[op] = kernel_id
            elif self.strict:
                raise TableError(f"policy: cannot lock {op} to {kernel_id}: {why}")
            else:
                warn(f"lzsolve: policy: lock {op}={kernel_id} ignored: {why}", stacklevel=4)
        libraries = {spec.library for spec in registry.REGISTRY.values()}
        for library in sorted(self.policy.avoid - libraries):
            warn(f"lzsolve: policy: no kernel of this runtime comes from {library!r} (avoid has no effect); "
                 f"libraries: {', '.join(sorted(libraries))}", stacklevel=4)
        if self.policy:
            log.warning("lzsolve: policy: %s", self.policy.describe())

    # --- resolution (first call of a key) ------------------------------------
    def _pick(self, sig, dims: dict, on_cuda: bool, broken: frozenset = frozenset()) -> tuple:
        """(kernel spec, from the table or a lock, why) for a call of signature `sig` at `dims`:
        the policy first (disable), a dim of 0 (EMPTY_INPUT: the fallback, whatever a lock says),
        the policy's lock, then the tree's leaf: its kernel or, where that one is
        avoided, unusable or broken for this key, its next ranked kernel; else the fallback."""
        fallback = registry.fallback_for(sig)
        if self.policy.disable:
            return fallback, False, "policy: disabled"
        if self.table is not None and on_cuda != self._on_cuda:
            return fallback, False, "another device than the table's"
        if 0 in dims.values():
            empty = next(dim for dim, value in dims.items() if value == 0)
            return fallback, False, f"{EMPTY_INPUT} ({empty}=0): the fallback returns what PyTorch does"
        locked = self._locks.get(sig.op)
        if locked is not None:
            if locked in broken or locked in self._dropped:
                return fallback, False, f"policy: lock {locked} failed on this call"
            wrong = registry.get(locked).semantic_reasons(sig)
            if not wrong:
                return registry.get(locked), True, f"policy: lock {sig.op}={locked}"
            self._warn_once(("lock", str(sig)), f"lzsolve: policy: lock {sig.op}={locked} cannot compute {sig} "
                                                f"({wrong[0]}); those calls use the fallback")
            return fallback, False, f"policy: lock {locked} cannot compute it ({wrong[0]})"
        tree = self._trees.get(str(sig))
        if tree is None:
            return fallback, False, "outside the table"
        past = _past(self._limits.get(sig.op, {}), dims)
        if past:
            return fallback, False, past
        leaf = leaf_for(tree, dims)
        for rank, kernel_id in enumerate(leaf_kernels(leaf)):
            if kernel_id in self._usable and kernel_id not in broken:
                return registry.get(kernel_id), True, "the table's choice" if rank == 0 else f"ranked #{rank + 1}"
        return fallback, False, "no kernel of the leaf is usable here"

    def _chose_fallback(self, spec, sig: Signature) -> bool:
        """Whether the table (not a lock) chose the op's fallback for `sig`: a caller with code of its
        own (a patched module) runs that instead, the same computation without the table's lookup."""
        return spec.kernel_id == registry.fallback_for(sig).kernel_id and sig.op not in self._locks

    def _choose(self, call, op: OpSchema, kernel_args: tuple, broken: frozenset = frozenset()) -> tuple:
        """(kernel spec, from the table, why) for a call: _pick's choice, or for a call no signature
        describes (call None) op.outside's kernel or the op's fallback. Calls past the range the
        table was tuned over are warned about once per signature (not while Dynamo traces a call:
        it cannot trace a warning, and fullgraph=True would fail on it)."""
        if call is None:
            return registry.get(op.outside(*kernel_args) if op.outside else op.fallback), False, "no signature"
        if len(call) > 2:  # its signature's, but not what the table was tuned for (OpSchema.read says why)
            return registry.fallback_for(call[0]), False, call[2]
        spec, from_table, why = self._pick(call[0], call[1], _any_cuda(kernel_args), broken)
        if why.startswith(PAST_RANGE) and not torch.compiler.is_compiling():
            self._warn_once(("past", str(call[0])), f"lzsolve: calls of {call[0]} {why} use the fallback (a patched "
                            "module's own code): tune with a larger grid or --workload")
        return spec, from_table, why

    def _resolve(self, cache: dict, key: tuple, call, op: OpSchema, kernel_args: tuple,
                 hand_back: bool = False) -> Entry:
        """call: OpSchema.read's (signature, dims, and why the table may not serve it, if so), None for
        a call no signature describes (then served by op.outside, or the fallback); op: the method's first op, named in stats() for such calls.
        hand_back (Dispatcher.served): a call the table does not serve resolves to NOT_SERVED, for its
        caller's own code, except while recording (a recording counts the calls its fallbacks serve)."""
        spec, from_table, why = self._choose(call, op, kernel_args, self._broken.get((op.method, key), frozenset()))
        name = call[0].op if call is not None else op.name
        impl, kernel_id, calls = spec.impl, spec.kernel_id, itertools.count()
        recording = _recording
        if hand_back and recording is None:  # (a recording counts what the table decided, the fallback included)
            if from_table and call is not None and self._chose_fallback(spec, call[0]):
                from_table, why = False, CHOSE_FALLBACK
            if not from_table:
                impl, kernel_id = _handing_back(calls), OWN_CODE
        entry = Entry(impl, calls, name, kernel_id, from_table, str(call[0]) if call else None, why)
        if len(cache) < MAX_CACHED_KEYS:
            if from_table and OPS[name].consumes and not self.strict:
                entry = entry._replace(impl=self._probe(cache, key, spec.impl, OPS[name]))
            cache[key] = entry
            if recording is not None:  # its calls are counted on the entry, and read when the recording stops
                recording.track(call, spec, from_table, calls)
            return entry
        if recording is not None:  # an uncached key resolves at every call: counted as it is
            recording.count(call, spec, from_table)
        with self._stats_lock:
            return self._uncached.setdefault(entry.tally, entry)

    # --- the circuit breaker (a table kernel raised) ------------------------
    def _probe(self, cache: dict, key: tuple, impl, op: OpSchema):
        """The first call of a key with a kernel that may overwrite its inputs (op.consumes): copies
        of those inputs are kept, and put back if the kernel raises, so the call can be served
        again; after one success the key calls the kernel directly (later failures of such an op
        cannot be re-served: its inputs may be half overwritten, so they raise)."""
        def probe(*args):
            out = _call_restoring(impl, args, op)
            entry = cache.get(key)
            if entry is not None and entry.impl is probe:
                cache[key] = entry._replace(impl=impl)
            return out

        probe.restores_inputs = True
        return probe

    def _recover(self, error: Exception, cache: dict, key: tuple, entry: Entry, call, op: OpSchema, kernel_args: tuple,
                 hand_back: bool = False):
        """Serve again a call whose table kernel raised, with the leaf's next kernel (then the
        fallback). A kernel is blamed only once another one served the same arguments: when the
        fallback raises too, the error is the caller's (bad arguments) and is raised, as it is when
        strict, for a fallback's own call, or for a consuming op whose inputs may be overwritten."""
        if self.strict or not entry.from_table or call is None:
            raise error
        consumes = OPS[entry.op].consumes
        if consumes and not getattr(entry.impl, "restores_inputs", False):
            self._break(entry.op, entry.kernel_id, op.method, key, error, entry)
            raise error  # the kernel may have overwritten its inputs: nothing can serve them again
        on_cuda = _any_cuda(kernel_args)
        failed = [entry.kernel_id]
        while True:
            broken = self._broken.get((op.method, key), frozenset()) | set(failed)
            spec, from_table, _ = self._pick(call[0], call[1], on_cuda, broken)
            try:
                out = _call_restoring(spec.impl, kernel_args, OPS[entry.op]) if consumes else spec.impl(*kernel_args)
                break
            except Exception:
                if not from_table:  # the fallback fails too: the caller's error, raised as before; no kernel blamed
                    raise error from None
                failed.append(spec.kernel_id)
        for i, kernel_id in enumerate(failed):
            if i:  # counted as called, like the first one, so that stats() counts it as failed, not served
                with self._stats_lock:
                    self._retired[entry._replace(kernel_id=kernel_id).tally] += 1
            self._break(entry.op, kernel_id, op.method, key, error, entry if i == 0 else None)
        if _recording is None:  # (a recording counted this call already, when it was resolved)
            retry = self._resolve(cache, key, call, op, kernel_args, hand_back)  # what serves that key now
            next(retry.calls)
        return out

    def _break(self, op_name: str, kernel_id: str, method: str, key: tuple, error: Exception, entry) -> None:
        """Record that `kernel_id` raised on `key`: the key stops using it (every key after BREAKER_LIMIT)."""
        with self._stats_lock:
            self._failed_calls[(op_name, kernel_id)] += 1
            self._failures[kernel_id] += 1
            failures = self._failures[kernel_id]
            broken = self._broken.get((method, key), frozenset()) | {kernel_id}
            if len(self._broken) < MAX_CACHED_KEYS:
                self._broken[(method, key)] = broken
            for cache in (self._caches[method], self._served_caches[method]):
                if entry is not None and cache.get(key) is entry:
                    del cache[key]
                    self._retired[entry.tally] += counted(entry.calls)
        self._warn_once(("failed", kernel_id), f"lzsolve: {kernel_id} raised on {op_name} ({type(error).__name__}: "
                        f"{str(error)[:200]}); that call shape now uses the next ranked kernel or the fallback")
        if failures >= BREAKER_LIMIT or len(self._broken) >= MAX_CACHED_KEYS:
            self._warn_once(("disabled", kernel_id), f"lzsolve: {kernel_id} failed {failures} times; "
                            "it is no longer used for any call")
            self._drop(kernel_id, f"raised {failures} times")

    def _warn_once(self, what: tuple, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warn(message, stacklevel=4)

    def traced_call(self, method: str, *args, **kwargs):
        """A call of `method` resolved without the caches, the counts or the circuit breaker, for
        Dynamo to trace (patch(traced=True) under torch.compile): the choice depends on the call's
        shapes and dtypes alone, which Dynamo guards, and the kernel's ops join the graph. stats()
        does not see these calls."""
        spec, kernel_args, _ = self._traced(method, args, kwargs)
        return spec.impl(*kernel_args)

    def traced_served_call(self, method: str, *args, **kwargs):
        """traced_call for Dispatcher.served's callers: NOT_SERVED where the traced call would take
        the fallback (or the table chose it), so that the caller's own code is what the graph holds,
        as unpatched."""
        spec, kernel_args, served = self._traced(method, args, kwargs, hand_back=True)
        return spec.impl(*kernel_args) if served else NOT_SERVED

    def _traced(self, method: str, args: tuple, kwargs: dict, hand_back: bool = False) -> tuple:
        """(kernel spec, kernel arguments, from the table) of a traced call: the table's choice, or
        under traced_fuse the fallback of an op Inductor fuses (unless a lock names its kernel);
        hand_back: the table's choice of the fallback counts as not the table's (see _resolve)."""
        op = METHOD_OPS[method]
        call, (_, kernel_args) = op.read(*args, **kwargs), op.front(*args, **kwargs)
        spec, from_table, _ = self._choose(call, op, kernel_args)
        if from_table and self._inductor_fuses(call[0].op):
            return registry.fallback_for(call[0]), kernel_args, False
        return spec, kernel_args, from_table and not (hand_back and self._chose_fallback(spec, call[0]))

    def _inductor_fuses(self, op: str) -> bool:
        """Whether a traced call of `op` takes its fallback for Inductor to fuse (traced_fuse, an
        OpSchema.fusible op), its torch form, not the table's kernel: unless a lock names its kernel."""
        return self.traced_fuse and OPS[op].fusible and op not in self._locks

    def traced_kernel_for(self, method: str, *args, **kwargs) -> str:
        """The kernel id a call of `method` traced by torch.compile (patch(traced=True)) would use."""
        return self._traced(method, args, kwargs)[0].kernel_id

    def _entry(self, method: str, args: tuple, kwargs: dict) -> Entry:
        """The Entry a call of `method` resolves to, without calling it."""
        op = METHOD_OPS[method]
        key, kernel_args = op.front(*args, **kwargs)
        cache = self._caches[method]
        return cache.get(key) or self._resolve(cache, key, op.read(*args, **kwargs), op, kernel_args)

    def clear_cache(self) -> None:
        with self._stats_lock:
            for cache in (*self._caches.values(), *self._served_caches.values()):
                for entry in list(cache.values()):
                    self._retired[entry.tally] += counted(entry.calls)
                cache.clear()
            for memo in self._own_memos:  # their counters are the retired entries'
                memo.clear()

    def own_calls_memo(self) -> dict:
        """A memo for a caller with code of its own (a patched module): the input shapes it saw
        handed back -> the counter of the entry that did, which the caller advances itself for
        later calls of those shapes, skipping the table's lookup (and counted as before).
        Cleared with the caches (a recording's start, a kernel dropped), so counts stay exact; at
        most MAX_MEMO_SHAPES shapes are kept (the caller checks)."""
        memo = _OwnMemo()
        memo.new = self.own_calls_memo
        with self._stats_lock:
            self._own_memos.append(memo)
        return memo

    def hand_back(self, method: str, why: str, args: tuple, kwargs: dict) -> NotServed:
        """NOT_SERVED for a call of `method` that its caller (a patched module) runs with its own code
        before asking the table, for `why` (AUTOGRAD, AUTOCAST), counted in stats() and coverage() under that
        reason as the calls Dispatcher.served hands back are under theirs, so that no call of a
        patched module goes uncounted. Its NotServed names no counter: a caller's own_calls_memo
        must not skip the table for that shape once autograd stops recording (or autocast ends)."""
        op = METHOD_OPS[method]
        key = (why, op.front(*args, **kwargs)[0])  # beside served's keys, which never start with a reason
        cache = self._served_caches[method]
        entry = cache.get(key)
        if entry is None:
            call = op.read(*args, **kwargs)
            entry = Entry(_hand_back, itertools.count(), call[0].op if call else op.name, OWN_CODE, False,
                          str(call[0]) if call else None, why)
            if len(cache) < MAX_CACHED_KEYS:
                cache[key] = entry
            else:
                with self._stats_lock:
                    entry = self._uncached.setdefault(entry.tally, entry)
        next(entry.calls)
        return NOT_SERVED

    def _tallies(self) -> Counter:
        """Calls so far by Entry.tally (a call a table kernel raised on counted where it was resolved)."""
        with self._stats_lock:
            totals = Counter(self._retired)
            entries = [e for cache in (*self._caches.values(), *self._served_caches.values())
                       for e in list(cache.values())]
            entries += list(self._uncached.values())
        for e in entries:
            totals[e.tally] += counted(e.calls)
        return totals

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls since this dispatcher was made, per op and per kernel that served them:
        {"norm.rms": {"triton.rms_norm[...]": 96, ...}, ...}; a kernel the table did not choose
        (the call was outside the table, or its kernel is unusable here) is marked
        " (fallback)"; calls a table kernel raised on (then served by the next one) are counted
        under "<kernel> (failed)", not as served by it. Cheap: counts are kept per call key and summed here."""
        with self._stats_lock:
            failed = Counter(self._failed_calls)
        totals: Counter = Counter()
        for (op, kernel_id, from_table, _, _), n in self._tallies().items():
            totals[(op, kernel_id, from_table)] += n
        for (op, kernel_id), n in failed.items():
            totals[(op, kernel_id, True)] -= n  # counted when called; served by the kernel after it
        out: dict[str, dict[str, int]] = {}
        for (op, kernel_id, from_table), n in sorted(totals.items()):
            if n:
                out.setdefault(op, {})[kernel_id if from_table else f"{kernel_id} (fallback)"] = n
        for (op, kernel_id), n in sorted(failed.items()):
            out.setdefault(op, {})[f"{kernel_id} (failed)"] = n
        return out

    def coverage(self) -> dict:
        """The share of calls since this dispatcher was made that the table served:
        {"calls", "served", "share" (None before any call), "outside": {signature: {"calls", "why"}}},
        the calls it did not serve by signature, with each reason they had and its calls, most calls
        first ("why": {"past the tuned range (tokens=40 > 24)": 3, "weight is fp32, ...": 1}: outside
        the table, past the tuned range, an empty input, no usable kernel, policy...). Calls no
        signature describes are under "(no signature)"; a call a table kernel raised on counts as the
        table's. Every count is stats()'s: "calls" is the sum of its counts."""
        calls = served = 0
        outside: dict[str, Counter] = {}
        for (_, _, from_table, sig, why), n in self._tallies().items():
            calls += n
            if from_table:
                served += n
            elif n:
                outside.setdefault(sig or "(no signature)", Counter())[why] += n
        rows = {sig: {"calls": sum(reasons.values()),
                      "why": dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0])))}
                for sig, reasons in sorted(outside.items())}
        return {"calls": calls, "served": served, "share": served / calls if calls else None, "outside": rows}

    def cached_keys(self) -> int:
        return sum(len(cache) for cache in (*self._caches.values(), *self._served_caches.values()))

    def covers(self, sig: Signature) -> bool:
        """Whether the table (or a policy lock) serves calls of `sig` here, at some dims, with a
        kernel other than the op's fallback: a patch replaces a module, or fuses sibling linears,
        only where this holds for what the module calls."""
        return self.uncovered(sig) is None

    def uncovered(self, sig: Signature) -> str | None:
        """Why no call of `sig` is served from the table or a lock here; None when some are."""
        if self.policy.disable:
            return "policy: disabled"
        locked = self._locks.get(sig.op)
        if locked is not None:
            wrong = registry.get(locked).semantic_reasons(sig)
            return f"policy: lock {locked} cannot compute it ({wrong[0]})" if wrong else (
                f"policy: lock {locked} failed" if locked in self._dropped else None)
        if self.table is None:
            return f"no table ({self.load_error})" if self.load_error else "no table"
        tree = self._trees.get(str(sig))
        if tree is None:
            return "not in the table"
        if self.traced and self._inductor_fuses(sig.op):
            return TRACED_FUSIBLE
        kernels = {k for leaf in leaves(tree) for k in leaf_kernels(leaf)}
        fallback = registry.fallback_for(sig).kernel_id
        if kernels & self._usable - {fallback}:
            return None
        if fallback in kernels:
            return f"{CHOSE_FALLBACK} ({fallback}) wherever a kernel of its entry serves here"
        return "no kernel of its entry is usable here (" + "; ".join(
            f"{k}: {self._unusable.get(k, 'dropped')}" for k in sorted(kernels)) + ")"

    def serves(self, method: str, *args, **kwargs) -> bool:
        """Whether the table (or a policy lock) serves this call of `method`; False: the op's
        fallback would. An integration that replaced a client's function keeps the client's own
        code for such calls, which may be faster than the fallback (transformers backs Qwen3.5's
        delta rules with FLA when it is installed). While recording, every call counts as served."""
        return _recording is not None or self._entry(method, args, kwargs).from_table

    def kernel_at(self, sig: Signature, dims: dict) -> str:
        """The kernel id a call of `sig` at dynamic dims `dims` would use here (policy, tuned range and
        the kernels usable here applied), without making one."""
        return self._pick(sig, dims, self._on_cuda)[0].kernel_id

    def kernel_for(self, method: str, *args, **kwargs) -> str:
        """The kernel id a call of `method` ('attention', 'rms_norm', ...) with these args would use."""
        return self._entry(method, args, kwargs).kernel_id

    def explain(self, op: str | None = None, *, dtype: str | None = None, flags=(), **dims) -> dict:
        """Why a call of `op` with these dims (static and dynamic, by name) is served as it is:
        {"signature", "kernel" (what serves it now, after policy and circuit breaker), "reason",
        "from_table", "leaf" (the tree's path to it, its kernel, gain over the fallback and ranked
        runner-ups with their measured ratios and, where one cannot serve here, why; None outside
        the table), "policy"}. dtype defaults to the table's model dtype.
        With no op, the table's entries: {"table", "load_error", "policy", "entries": {signature:
        {"served", "why" (None where served), "kernels": {kernel: "usable" or why not}}}}."""
        if op is None:
            return self._explain_table()
        schema = OPS[op]
        dtype = dtype or (self.table.raw["model"]["dtype"] if self.table else "bf16")
        static = {d: v for d, v in dims.items() if d in schema.all_static}
        dynamic = {d: v for d, v in dims.items() if d not in static}
        if set(dynamic) != set(schema.dynamic):
            raise ValueError(f"{op} needs dynamic dims {schema.dynamic}, got {tuple(dynamic)}")
        sig = Signature.make(op, static, flags, dtype)
        spec, from_table, reason = self._pick(sig, dynamic, self._on_cuda)
        tree = self._trees.get(str(sig))
        leaf = None
        if tree is not None:
            found = leaf_for(tree, dynamic)
            leaf = {"path": _path(tree, dynamic), "kernel_id": found.kernel_id, "gain": found.gain,
                    "ranked": [{"kernel_id": k, "ratio": r, "usable": k in self._usable} for k, r in found.ranked],
                    "unusable": {k: self._unusable.get(k, "dropped") for k in leaf_kernels(found)
                                 if k not in self._usable}}
        return {"signature": str(sig), "kernel": spec.kernel_id, "from_table": from_table, "reason": reason,
                "leaf": leaf, "policy": self.policy.describe()}

    def _explain_table(self) -> dict:
        entries = {}
        trees = self.table.trees if self.table is not None else {}
        for sig, tree in sorted(trees.items(), key=lambda item: str(item[0])):
            kernels = sorted({k for leaf in leaves(tree) for k in leaf_kernels(leaf)})
            why = self.uncovered(sig)
            entries[str(sig)] = {"served": why is None, "why": why,
                                 "kernels": {k: "usable" if k in self._usable else self._unusable.get(k, "dropped")
                                             for k in kernels}}
        return {"table": self.table.source if self.table else None, "load_error": self.load_error,
                "policy": self.policy.describe(), "entries": entries}

    def verify(self, budget_s: float = VERIFY_BUDGET_S) -> dict[str, str]:
        """Check each usable kernel of the table against its op's fallback, on random inputs at the
        first grid point where a leaf names it, for every signature it serves; one that disagrees
        beyond twice the tune's tolerance (each of the two is within it of the fp32 reference), or
        raises, is dropped: its entries use the next ranked kernel or the fallback. Kernels not
        reached within budget_s seconds are dropped too (an unchecked kernel is not trusted).
        Returns kernel -> why it was dropped (load(verify=True) warns with it)."""
        if self.table is None:
            return {}
        device = torch.device("cuda" if self._on_cuda else "cpu")
        deadline, dropped = time.monotonic() + budget_s, {}
        for sig, tree in self.table.trees.items():
            grid = self.table.raw["buckets"].get(sig.op, {})
            for dims in (dict(zip(grid, values)) for values in itertools.product(*grid.values())):
                for kernel_id in leaf_kernels(leaf_for(tree, dims)):
                    if kernel_id not in self._usable or (kernel_id, str(sig)) in self._verified:
                        continue
                    self._verified.add((kernel_id, str(sig)))
                    why = (f"not verified within {budget_s:g} s" if time.monotonic() > deadline
                           else _disagreement(sig, dims, kernel_id, device))
                    if why:
                        dropped[kernel_id] = why
                        self._drop(kernel_id, why)
        if self._on_cuda:
            torch.cuda.synchronize()
        return dropped

    def warmup(self, strict: bool = False) -> int:
        """Call every kernel the table serves once per leaf (at the smallest and largest grid point it
        serves), so JIT compilation happens now rather than in a server's first request. A kernel
        that raises is dropped for every call, with a warning (TableError when strict), and the
        kernel that replaces it (the next ranked one) is warmed instead. Returns the calls made."""
        if self.table is None:
            return 0
        device = torch.device("cuda" if self._on_cuda else "cpu")
        calls = 0
        was_strict, self.strict = self.strict, True  # errors reach this loop, not the circuit breaker
        try:
            for sig, _tree in self.table.trees.items():
                grid = self.table.raw["buckets"].get(sig.op, {})
                by_kernel: dict[str, list[dict]] = {}
                for dims in (dict(zip(grid, values)) for values in itertools.product(*grid.values())):
                    by_kernel.setdefault(self._pick(sig, dims, self._on_cuda)[0].kernel_id, []).append(dims)
                for served in by_kernel.values():
                    for dims in (served[0], served[-1]) if len(served) > 1 else served:
                        calls += self._warm(sig, dims, device, strict)
        finally:
            self.strict = was_strict
        if self._on_cuda:
            torch.cuda.synchronize()
        return calls

    def _warm(self, sig, dims: dict, device, strict: bool) -> int:
        """One warm-up call of what serves `sig` at `dims` (nothing when that is the fallback)."""
        while True:
            spec, from_table, _ = self._pick(sig, dims, self._on_cuda)
            if not from_table:
                return 0
            try:
                getattr(self, OPS[sig.op].method)(*example_args(sig, dims, device))
                return 1
            except Exception as e:
                if strict:
                    raise TableError(f"warm-up of {spec.kernel_id} on {sig} at {dims} failed: {e}") from e
                warn(f"lzsolve: {spec.kernel_id} failed its warm-up on {sig} ({type(e).__name__}: {e}); "
                     "its table entries use the next ranked kernel or the fallback", stacklevel=3)
                self._drop(spec.kernel_id, f"failed its warm-up ({type(e).__name__})")

    def _drop(self, kernel_id: str, why: str) -> None:
        """Stop using `kernel_id` for any call (a table's choice, ranked runner-up or lock)."""
        self._dropped.add(kernel_id)
        self._usable.discard(kernel_id)
        self._unusable[kernel_id] = why
        self.clear_cache()


# --- the public methods, one per OpSchema.method --------------------------------------------------
# The hot path: the op's front, inlined (one tuple for the key; the kernel's arguments passed as they
# are where the front lists them), one dict read, one count, the kernel. Generated from the records
# so that every op is served the same way.
METHOD_OPS: dict[str, OpSchema] = {}  # method -> its first op (attention: attention.prefill)


# The method is compiled from a template with the front's own parameter list, as dataclasses and
# namedtuple build __init__: Python binds the arguments (keywords and defaults included) in C, where a
# generic (*args, **kwargs) wrapper cost 0.1-0.5 us per call. Only the records' parameter names (checked
# to be identifiers) and the expressions of their fronts (see _inlined) enter the source; defaults are
# passed in as objects. `bind` makes one Dispatcher's method, a closure over its cache's get: a call
# reads no attribute of the Dispatcher and passes no self (50-90 ns of a ~0.5 us overhead, measured).
METHOD_TEMPLATE = """
def bind(self, hand_back):
    cache = (self._served_caches if hand_back else self._caches).setdefault({name!r}, {{}})
    get = cache.get

    def {name}({params}):
        {key_line}
        entry = get(key) or self._resolve(cache, key, call({args}), op, {kernel_args}, hand_back)
        next(entry.calls)
        try:
            return entry.impl({spread})
        except Exception as error:  # free until raised (Python 3.11); the breaker: Dispatcher._recover
            return self._recover(error, cache, key, entry, call({args}), op, {kernel_args}, hand_back)

    {name}.__qualname__, {name}.__doc__, {name}.__annotations__ = qualname, doc, dict(annotations)
    return {name}
"""
TEMPLATE_NAMES = frozenset({"self", "cache", "get", "key", "kernel_args", "entry", "error", "front", "call", "op",
                            "hand_back"})


class _Method:
    """Dispatcher.<method>: bound to a Dispatcher on its first read (dispatchers made before the op
    was added included) and kept in its __dict__, where later reads find it first (this descriptor
    has no __set__). Where a subclass overrides the method, the override is what the instance's reads
    find, and its super().<method> gets the bound one, kept under another name. A race binds twice,
    to one cache."""

    def __init__(self, name: str, bind, doc: str | None):
        self.name, self.bind, self.__doc__ = name, bind, doc

    def __get__(self, dispatcher, owner=None):
        if dispatcher is None:
            return self
        name = self.name if getattr(type(dispatcher), self.name) is self else f"_{self.name}_bound"
        method = dispatcher.__dict__.get(name)
        if method is None:
            method = dispatcher.__dict__[name] = self.bind(dispatcher, False)
        return method


class _Served:
    """Dispatcher.served: the Dispatcher's methods, except that a call the table (or a lock) does not
    serve returns NOT_SERVED instead of running the op's fallback, for its caller's own code. Each
    method is bound on its first read and kept in this object's __dict__, where later reads find it."""

    def __init__(self, dispatcher: Dispatcher):
        self._dispatcher = dispatcher

    def __getattr__(self, method: str):
        if method not in METHOD_OPS:
            raise AttributeError(f"Dispatcher.served has no method {method!r}")
        bound = self.__dict__[method] = Dispatcher.__dict__[method].bind(self._dispatcher, True)
        return bound


class Inlined(NamedTuple):
    """A front compiled into its method: the source of its key and of its kernel arguments (a
    tuple), and, where those are a tuple literal, its elements, which the method passes to the
    kernel as they are: building the tuple and calling through *args cost 20-25 ns of a ~0.5 us
    replay overhead (measured on the CPU VM)."""

    key: str
    kernel_args: str
    spread: str | None


def _inlined(op: OpSchema) -> Inlined | None:
    """The front's `key, kernel_args`, to be compiled into the method, for a front whose body (its
    docstring aside) is one `return key, kernel_args` that reads its parameters and nothing else:
    the call of the front (a frame and a tuple of two) cost 40-70 ns of a ~0.5 us replay overhead.
    None for any other front, which the method calls instead."""
    front, names = op.front, [p.name for p in op.parameters]
    if not isinstance(front, types.FunctionType) or hasattr(front, "__wrapped__"):
        return None  # getsource would read the wrapped function, not what the front does
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(front))).body[0]
    except (OSError, TypeError, SyntaxError):
        return None
    if not isinstance(node, ast.FunctionDef) or [a.arg for a in node.args.args] != names:
        return None  # (a source that is not the function's any more)
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Tuple):
        return None
    returned = body[0].value
    reads = [n for n in ast.walk(returned) if isinstance(n, ast.Name)]
    if len(returned.elts) != 2 or any(n.id not in names or not isinstance(n.ctx, ast.Load) for n in reads):
        return None  # a global (or a local of a comprehension) means what it means in the front's module only
    key, kernel_args = returned.elts
    literal = isinstance(kernel_args, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in kernel_args.elts)
    return Inlined(f"({ast.unparse(key)})", f"({ast.unparse(kernel_args)})",
                   ", ".join(ast.unparse(e) for e in kernel_args.elts) if literal else None)


def _method(op: OpSchema) -> _Method:
    parameters = op.parameters
    if not all(p.name.isidentifier() and p.kind == p.POSITIONAL_OR_KEYWORD for p in parameters):
        raise ValueError(f"{op.name}: a front takes named parameters only, got {inspect.signature(op.front)}")
    taken = TEMPLATE_NAMES.intersection(p.name for p in parameters)
    if taken:  # such a parameter would stand in for the template's own name
        raise ValueError(f"{op.name}: the method template uses the names of its front's parameters {sorted(taken)}")
    defaults = {f"_default_{p.name}": p.default for p in parameters if p.default is not p.empty}
    params = ", ".join(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}" for p in parameters)
    args = ", ".join(p.name for p in parameters)
    inlined = _inlined(op)
    if inlined is None:
        key_line, kernel_args, spread = f"key, kernel_args = front({args})", "kernel_args", "*kernel_args"
    else:
        key_line, kernel_args = f"key = {inlined.key}", inlined.kernel_args
        spread = inlined.spread if inlined.spread is not None else f"*{kernel_args}"
    source = METHOD_TEMPLATE.format(name=op.method, params=params, args=args, key_line=key_line,
                                    kernel_args=kernel_args, spread=spread)
    namespace = {"front": op.front, "call": op.read, "op": op, "qualname": f"Dispatcher.{op.method}",
                 "doc": op.front.__doc__, "annotations": op.front.__annotations__, **defaults}
    exec(source, namespace)  # noqa: S102 - our own records' names and fronts, never an artifact's
    return _Method(op.method, namespace["bind"], op.front.__doc__)


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
        setattr(dispatcher.traced_ops, op.method, functools.partial(dispatcher.traced_call, op.method))


Dispatcher.METHODS = {}  # op -> the method that serves it (attention.prefill -> attention)
for _op in OPS.values():
    serve_op(_op)
