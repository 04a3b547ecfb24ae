"""Planning and tuning: op instances x grid x candidates -> gated, measured PerfRecords.

`make_plan` is the dry run (capability gate only); `tune` sends every admitted
(workload, candidate) to a runner (parity gate, then timing, in a worker
process), appends records to the PerfDB one signature at a time, and reuses
matching records a previous run already measured (same workload, kernel
version, hardware and timer), so an interrupted run continues instead of
restarting. `probe` then times, at unaligned points inside the buckets, the
contenders the buckets left: kernels with alignment cliffs look better on the
grid's powers of two than on the lengths real requests have.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fnmatch
import itertools
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from lzsolve import __version__
from lzsolve.decide.solve import Points, points_from
from lzsolve.errors import LzError, WriteError
from lzsolve.limits import check_fits
from lzsolve.measure.devices import device_index, groups_apart, run_sharded
from lzsolve.measure.gates import capability_gate
from lzsolve.measure.grid import Grid, as_grid, probe_points, workloads
from lzsolve.measure.harness import MODES, Budget
from lzsolve.measure.tasks import COPY_PROBE_LIKE, CeilingTask, ParityTask, Task, TimingTask
from lzsolve.models import OpInstance
from lzsolve.models.capture import UNSERVED, Captured
from lzsolve.ops import CONTRACTS
from lzsolve.store.jit_store import copy_files, named_files, store_root
from lzsolve.store.perfdb import CEILINGS_GLOB, DIMS, PerfDB, dims_key
from runtime_loader import registry
from runtime_loader.hardware import device_info, hardware_signature, slug
from runtime_loader.inputs import ROUTED_OPS, ROUTING_SKEW, routing_skew
from runtime_loader.ops import OPS, Signature
from runtime_loader.specs import EXCLUDED, KernelSpec, Reason


class Runner(Protocol):
    """Runs measurement tasks: in a worker process (worker.WorkerRunner) or in-process."""

    timer: str

    def run(self, task: Task) -> dict: ...


@dataclass(frozen=True)
class Candidate:
    spec: KernelSpec
    reasons: tuple[Reason, ...]  # capability gate; empty = admitted to the parity gate

    @property
    def admitted(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class SignaturePlan:
    instance: OpInstance
    workloads: tuple[dict, ...]
    candidates: tuple[Candidate, ...]

    @property
    def fallback(self) -> str:
        return registry.fallback_for(self.instance.signature).kernel_id

    def diagnostic(self) -> str | None:
        """One actionable line when nothing but the fallback can compute this op: what is
        missing from which kernels (None when an optimised candidate is admitted)."""
        if any(c.admitted and c.spec.kernel_id != self.fallback for c in self.candidates):
            return None
        sig = self.instance.signature
        considered = [f"{c.spec.kernel_id} ({c.reasons[0].code})" for c in self.candidates
                      if c.spec.kernel_id != self.fallback]
        return (f"{sig}: no optimised kernel supports it, so it runs its reference fallback {self.fallback}; "
                f"considered: {', '.join(considered) or 'none registered for ' + sig.op}")


@dataclass(frozen=True)
class Plan:
    model: Captured
    dtype: str
    device: torch.device
    grid: Grid
    hardware: dict
    signatures: tuple[SignaturePlan, ...]

    @property
    def measurements(self) -> int:
        """How many (workload, candidate) pairs reach the parity gate."""
        return sum(len(sp.workloads) * sum(c.admitted for c in sp.candidates) for sp in self.signatures)


def _selected(kernel_id: str, only: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    if only and not any(fnmatch.fnmatchcase(kernel_id, p) for p in only):
        return False
    return not any(fnmatch.fnmatchcase(kernel_id, p) for p in exclude)


def make_plan(model: Captured, dtype: str, device: torch.device, grid: Grid | str,
              only: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> Plan:
    """The dry run: every op signature, its grid points and each candidate's capability verdict.
    `only` / `exclude` are glob patterns on kernel ids; the op's fallback is always kept,
    since every gain is measured against it."""
    here = device_info(device)
    grid = as_grid(grid)
    plans = []
    for instance in model.instances:
        sig = instance.signature
        candidates = []
        for spec in registry.candidates(sig.op):
            if spec.kernel_id != registry.fallback_for(sig).kernel_id and not _selected(spec.kernel_id, only, exclude):
                reasons = (Reason(EXCLUDED, "left out by --kernels/--exclude"),)
            else:
                reasons = tuple(capability_gate(spec, sig, here))
            candidates.append(Candidate(spec, reasons))
        plans.append(SignaturePlan(instance, tuple(workloads(grid, sig.op)), tuple(candidates)))
        check_inputs_fit(sig, plans[-1].workloads, device)
    return Plan(model, dtype, device, grid, hardware_signature(device), tuple(plans))


def check_inputs_fit(sig: Signature, points: tuple[dict, ...], device: torch.device) -> None:
    """Refuse a signature whose largest input (a weight or an activation) at the grid's largest
    shape could not exist on `device`, before any worker allocates it: its inputs are made on
    the meta device, which has shapes and no memory."""
    if not points:
        return
    largest = {dim: max(p[dim] for p in points) for dim in points[0]}
    try:
        args = CONTRACTS[sig.op].make_inputs(sig, largest, torch.device("meta"), torch.Generator())
    except (RuntimeError, ArithmeticError, ValueError, TypeError) as e:  # ArithmeticError: a size 0 divides
        raise LzError(f"{sig} at {largest}: its inputs cannot be made ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}); fix the model's sizes") from None
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return
    big = max(tensors, key=lambda t: t.numel() * t.element_size())
    named = {**dict(sig.static), **largest}
    dims = [name for name, value in named.items() if value == max(big.shape)] or ["its static dims"]
    check_fits(f"{sig} at {', '.join(f'{k}={v}' for k, v in largest.items())}", tuple(big.shape),
               big.element_size(), device, f"check {' / '.join(dims)} (the model's sizes) or the grid")


def notes(plan: Plan) -> list[str]:
    """Lines a user must read before trusting the plan: what the model computes that no op models
    (so nothing tunes it), and ops only a reference fallback computes."""
    return ([f"{plan.model.name}: {'' if UNSERVED in part else 'not tuned: '}{part}" for part in plan.model.notes]
            + [line for sp in plan.signatures if (line := sp.diagnostic())])


def fresh_seeds():
    """Seeds for input draws: new random inputs every workload, every run."""
    return itertools.count(int.from_bytes(os.urandom(6), "little"))


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


class Recorder:
    """Builds PerfDB records with the run's provenance."""

    def __init__(self, model: str, tp: int, dtype: str, device: torch.device, hardware: dict, run_id: str, timer: str,
                 device_index: int | None = None, sample_time: float = Budget.time_cap_s):
        self.run_id, self.timer, self.sample_time = run_id, timer, sample_time
        self.hw_slug = slug(hardware)
        self.common = {
            "run_id": run_id,
            "model": model,
            "tp": tp,
            "dtype": dtype,
            "timer": timer,
            "device": str(device),
            "device_index": device_index if device_index is not None else device.index or 0,
            "hw_slug": self.hw_slug,
            "hw_json": json.dumps(hardware, sort_keys=True),
            "torch_version": torch.__version__,
            "lzsolve_version": __version__,
            "capabilities_hash": registry.capabilities_hash(),
            "sample_time": sample_time,
        }

    def record(self, sp: SignaturePlan, spec: KernelSpec, dims: dict, **fields) -> dict:
        sig = sp.instance.signature
        contract = CONTRACTS[sig.op]
        fields.pop("fatal", None)
        fields.pop("restart", None)
        return {
            **self.common,
            "ts": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),  # UTC; naive so readers need no tz database
            "signature": str(sig),
            "op": sig.op,
            "roles": ",".join(sp.instance.roles),
            "kernel_id": spec.kernel_id,
            "library": spec.library,
            "kernel_version": spec.version(),
            "is_fallback": spec.kernel_id == sp.fallback,
            "status": "rejected" if fields.get("reason_code") else "ok",
            **{d: dims.get(d) for d in DIMS},
            "dims": dims_key(dims),
            "flops": contract.flops(sig, dims),
            "bytes": contract.bytes_moved(sig, dims),
            "routing_skew": routing_skew() if sig.op in ROUTED_OPS else None,
            **fields,
        }


def _reusable(db: PerfDB, recorder: Recorder, cached_from: str | None = None) -> dict[tuple, dict]:
    """Records of earlier runs that measured the same thing on this machine and stack (_key: the
    signature, the kernel and its version, the dims; the hardware, timer and MoE routing skew), with
    samples as long as this run's or longer, or whose every timing reached the target spread (this
    run's sampling would have stopped there too) or whose kernel failed parity (no sampling decided
    that); an eager timing only with the host's time beside it (host_ms: older records lack it);
    never those of `lzsolve evaluate`, whose shapes must stay unseen by the tables they judge.
    cached_from: `db` is the measurement cache, named so in every record taken from it (its
    provenance in the artifact's PerfDB)."""
    if not db.files():
        return {}
    # nor a first call made ahead unchecked (stage 'compile'), which holds no verdict
    rows = db.rows("SELECT * FROM records WHERE hw_slug = ? AND timer = ? "
                   "AND stage NOT IN ('capability', 'compile') "
                   "AND coalesce(reason_code, '') <> 'TIMEOUT' "  # a longer --timeout may pass
                   "AND run_id NOT LIKE 'eval-%' "
                   "AND NOT (status = 'ok' AND eager_ms IS NOT NULL AND host_ms IS NULL) "
                   "AND (coalesce(sample_time, ?) >= ? OR stage = 'parity' OR status = 'ok' "
                   "     AND coalesce(eager_spread, graph_spread) IS NOT NULL "
                   "     AND coalesce(eager_spread, 0) <= ? AND coalesce(graph_spread, 0) <= ?) "
                   f"AND (op NOT IN ({', '.join('?' for _ in ROUTED_OPS)}) OR coalesce(routing_skew, ?) = ?) "
                   "ORDER BY ts", [recorder.hw_slug, recorder.timer, Budget.time_cap_s, recorder.sample_time * 0.999,
                                   Budget.target_spread, Budget.target_spread,
                                   *ROUTED_OPS, ROUTING_SKEW, routing_skew()])
    return {_key(r): r for r in _from(rows, cached_from)}


def _from(rows: list[dict], cached_from: str | None) -> list[dict]:
    """The rows, each naming the measurement cache it came from (cached_from: the cache's path; None:
    not the cache) unless it already names one."""
    if cached_from is None:
        return rows
    return [{**r, "cached_from": r.get("cached_from") or cached_from} for r in rows]


def _naming_files(db: PerfDB, recorder: Recorder, cached_from: str | None = None) -> list[dict]:
    """The records of this hardware that name JIT cache files (jit_files), whatever their stage."""
    if not db.files():
        return []
    return _from(db.rows("SELECT * FROM records WHERE hw_slug = ? AND coalesce(jit_files, '[]') <> '[]' "
                         "ORDER BY ts", [recorder.hw_slug]), cached_from)


def _recorded_rejections(db: PerfDB, recorder: Recorder) -> dict[tuple, dict]:
    """Capability verdicts earlier runs recorded on this machine and stack, by key and Reason: a
    verdict that has not changed is not appended again (a re-run would double them)."""
    if not db.files():
        return {}
    rows = db.rows("SELECT * FROM records WHERE hw_slug = ? AND stage = 'capability' AND run_id NOT LIKE 'eval-%' "
                   "ORDER BY ts", [recorder.hw_slug])
    return {_rejection_key(r): r for r in rows}


def _rejection_key(record: dict) -> tuple:
    return (*_key(record), record["phase"], record["reason_code"], record["reason_message"])


def _key(record: dict) -> tuple:
    return record["signature"], record["kernel_id"], record["kernel_version"], record["dims"]


def measured_as(signature: str) -> str:
    """The signature a timing stands for: `signature` without its op's labels (OpSchema.labels),
    the flags that narrow which kernels may serve it but not what they compute. Qwen3's
    attention (qk_norm) and Llama's at the same heads time the same work, as do Llama 4's layers
    with and without QK-norm: a kernel timed for one is not timed again for the other."""
    op, _, inside = signature.partition("[")
    schema = OPS.get(op)
    if not schema or not schema.labels or not inside:
        return signature
    return f"{op}[{','.join(part for part in inside[:-1].split(',') if part not in schema.labels)}]"


def _work_key(key: tuple) -> tuple:
    """A reuse key (_key's) by the work timed: its signature as measured_as gives it."""
    signature, kernel_id, version, dims = key
    return measured_as(signature), kernel_id, version, dims


def _answers(record: dict, modes: tuple[str, ...]) -> bool:
    """Whether an earlier record holds what a measurement in `modes` asks for: a time in one of
    them, or the reason there is none (a rejection, a failed graph capture)."""
    return (record["status"] != "ok" or any(record.get(f"{m}_ms") is not None for m in modes)
            or bool(record.get("graph_error")))


def measure_workload(sp: SignaturePlan, dims: dict, specs: list[KernelSpec], runner: Runner,
                     recorder: Recorder, seed: int, on_step: Callable[[str], None], phase: str = "grid",
                     modes: tuple[str, ...] = MODES) -> list[dict]:
    """Parity for each kernel (its own task: a crash costs one record), then one timing task
    for all the admitted ones, interleaved. If that task dies, each kernel is timed alone so
    the failure lands on the kernel that caused it."""
    sig = sp.instance.signature
    records, admitted = [], {}
    for spec in specs:
        outcome = runner.run(ParityTask(sig, spec.kernel_id, dims, seed))
        if outcome.get("reason_code"):
            records.append(recorder.record(sp, spec, dims, seed=seed, phase=phase, **outcome))
            on_step(f"{sig.op} {spec.kernel_id}")
        else:
            admitted[spec.kernel_id] = (spec, outcome)
    groups = [tuple(admitted)] if admitted else []
    while groups:
        group = groups.pop()
        timing = runner.run(TimingTask(sig, group, dims, seed, modes))
        if "per_kernel" not in timing and len(group) > 1:
            groups.extend((k,) for k in group)
            continue
        for kernel_id in group:
            spec, parity = admitted[kernel_id]
            fields = timing["per_kernel"][kernel_id] if "per_kernel" in timing else timing
            records.append(recorder.record(sp, spec, dims, seed=seed, phase=phase, **{**parity, **fields}))
            on_step(f"{sig.op} {kernel_id}")
    return records


def measure_ceilings(db: PerfDB, runner: Runner, recorder: Recorder, dtype: str, reuse: bool = True) -> None:
    """The device's compute and memory ceilings for roofline fractions, once per machine,
    stack and dtype (a warm PerfDB keeps its own, unless its memory ceiling is an older probe's, a
    single memcpy that a CUDA graph ran slower than a copy: then the newer rows are read, the
    latest of each kind and mode). A failed probe leaves no row, no error."""
    if reuse and db.files(CEILINGS_GLOB):
        known = db.rows("SELECT count(*) AS n FROM ceilings WHERE hw_slug = ? AND timer = ? AND dtype = ? "
                        "AND kind = 'memory' AND probe LIKE ?", [recorder.hw_slug, recorder.timer, dtype, COPY_PROBE_LIKE])
        if known[0]["n"]:
            return
    result = runner.run(CeilingTask(dtype))
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    common = {k: recorder.common[k] for k in ("run_id", "hw_slug", "device", "timer")}
    db.append_ceilings([{**common, "ts": now, "dtype": dtype, **row} for row in result.get("ceilings", [])],
                       recorder.run_id)


Work = list[tuple[dict, tuple[Candidate, ...]]]  # (dims, candidates) of one signature


@dataclass(frozen=True)
class Lane:
    """One device of the run: its runner, the recorder that tags its records with it, and the
    signatures its worker has measured (their kernels' first calls made: run_sharded's `warm`)."""
    runner: Runner
    recorder: Recorder
    warm: set = field(default_factory=set, compare=False)


class Session:
    """One run's measuring: its runner and recorder (one lane per device: `more` are the runners of
    the other devices of a --devices run), the records earlier runs measured on this machine and
    stack (reused, never measured again), and the PerfDB new records go to.

    cache: the measurement cache every tune of this machine shares (MeasureConfig.cache_dir): its
    records answer this run as the PerfDB's own do, whatever model or artifact measured them, and
    are copied into this run's PerfDB when used (their cached_from says so); what this run measures
    goes to both. A signature is measured under both PerfDBs' locks (PerfDB.measuring: the run's,
    then the cache's), so tuners filling the cache at once wait for each other and reuse, never
    measure twice. A cache that cannot be read or written is left (`cache_note` says why) and the
    tune goes on without it."""

    def __init__(self, plan: Plan, db: PerfDB, runner: Runner, run_id: str | None = None, reuse: bool = True,
                 more: tuple[Runner, ...] = (), cache: PerfDB | None = None, sample_time: float = Budget.time_cap_s,
                 jit_work: Path | None = None):
        self.db, self.runner = db, runner
        self.jit_work = jit_work  # where the run's kernels compile (its .jit-work): the cache keeps and brings their files
        run_id = run_id or new_run_id()
        self.lanes = [Lane(r, Recorder(plan.model.name, plan.model.tp, plan.dtype, getattr(r, "device", plan.device),
                                       plan.hardware, run_id, r.timer, device_index(getattr(r, "device", plan.device), n),
                                       sample_time))
                      for n, r in enumerate((runner, *more))]
        self.recorder = self.lanes[0].recorder
        # PerfDB files this run has read: newer ones not its own are another tuner's. Listed before
        # they are read, so a file another tuner writes meanwhile is read again, not missed
        self.seen = db.names()
        self.reusable: dict[tuple, dict] = {}
        self.by_work: dict[tuple, dict] = {}  # the same records by the work they timed (_work_key)
        self._remember(_reusable(db, self.recorder) if reuse else {})
        self.rejections = _recorded_rejections(db, self.recorder)
        self.reuse = reuse
        self.seeds = fresh_seeds()
        self.cache, self.cache_note = cache, None
        self.cache_seen: set[str] = set()
        self.copied: set[tuple] = set()  # keys of cache records this run copied into its PerfDB
        self.shared: set[tuple] = set()  # keys answered by a twin signature's record (_reused), copied in too
        if cache is not None and cache.path.resolve() == db.path.resolve():
            self.cache = None  # (an artifact's own PerfDB named as the cache)
        self._read_cache()

    def _read_cache(self) -> None:
        """The cache's files this run has not read yet, into `reusable` (the run's own PerfDB's records
        win: theirs are already in the artifact)."""
        if self.cache is None:
            return
        try:
            names = self.cache.names()
            if self.reuse and names - self.cache_seen:
                self._remember(_reusable(self.cache, self.recorder, str(self.cache.path)), overwrite=False)
            self.cache_seen |= names
        except (LzError, OSError) as e:
            self._leave_cache(f"cannot be read ({str(e)[:300]})")

    def _remember(self, records: dict[tuple, dict], overwrite: bool = True) -> None:
        """Records that answer later measurements, by _key and by the work they timed."""
        for key, record in records.items():
            if overwrite or key not in self.reusable:
                self.reusable[key] = record
            work = _work_key(key)
            if overwrite or work not in self.by_work:
                self.by_work[work] = record

    def _reused(self, sp: SignaturePlan, key: tuple, modes: tuple[str, ...]) -> dict | None:
        """The earlier record that answers `key` in `modes`: its own, or one timed for a signature
        that differs from it only in labels (measured_as), copied under this signature (a table is
        solved from its own signature's records) and remembered as its own."""
        earlier = self.reusable.get(key)
        if earlier is not None and _answers(earlier, modes):
            return earlier
        twin = self.by_work.get(_work_key(key))
        if twin is None or twin["signature"] == key[0] or twin["status"] != "ok" or not _answers(twin, modes):
            return None
        copy = {**twin, "signature": key[0], "roles": ",".join(sp.instance.roles),
                "timed_as": twin.get("timed_as") or twin["signature"]}
        self.reusable[key] = copy
        self.shared.add(key)
        return copy

    def _leave_cache(self, why: str) -> None:
        self.cache_note = f"the measurement cache {self.cache.path} {why}; this run went on without it"
        self.cache = None

    def share(self, records: list[dict]) -> None:
        """What this run measured (not the capability verdicts: they cost nothing), into the cache,
        with the JIT files their first calls wrote (lzsolve.store.jit_store)."""
        measured, cache = [r for r in records if r.get("stage") != "capability"], self.cache  # (a builder's thread may leave it)
        if cache is None or not measured:
            return
        try:
            cache.append(measured, self.run_id)
            if self.jit_work is not None:
                copy_files(named_files(measured), self.jit_work, store_root(cache.path, self.recorder.hw_slug))
        except (LzError, WriteError, OSError) as e:
            self._leave_cache(f"cannot be written ({str(e)[:300]})")

    def bring_jit_files(self, plan: Plan) -> tuple[list[dict], int]:
        """Into this run's JIT folder, the files the cache keeps for the plan's admitted kernels
        (jit_store): what earlier runs on this hardware compiled, so that this run neither builds
        it again nor packs an artifact without it. The records that name them are every cache record
        that names files, of these kernels and of every configuration of their tunable families
        (before the search, the winners' files are there for its trials and comparisons), not only
        those the cache answers with: a builder's record names the module it built, and the grid's
        timing of the same workload, made later by a process that found it built, names none.
        Returns them and how many files were copied."""
        if self.cache is None or self.jit_work is None:
            return [], 0
        kernels = {(registry.family(c.spec.kernel_id), c.spec.version()) for sp in plan.signatures
                   for c in sp.candidates if c.admitted and c.spec.jit_caches}
        if not kernels:
            return [], 0
        try:
            named = [r for r in _naming_files(self.cache, self.recorder, str(self.cache.path))
                     if (registry.family(r["kernel_id"]), r["kernel_version"]) in kernels]
            return named, copy_files(named_files(named), store_root(self.cache.path, self.recorder.hw_slug), self.jit_work)
        except (LzError, OSError) as e:  # the cache or its store unreadable, or the run's own folder unwritable
            self._leave_cache(f"JIT files cannot be brought from it ({str(e)[:300]})")
            return [], 0

    @property
    def run_id(self) -> str:
        return self.recorder.run_id

    def measure(self, sp: SignaturePlan, work: Work, phase: str, modes: tuple[str, ...] = MODES,
                on_step: Callable[[str], None] = lambda label: None, lane: Lane | None = None) -> list[dict]:
        """Gate and time every (dims, candidates) of one signature on one lane (the first device
        unless told); returns the records, reused ones included. New records reach the PerfDB
        when the signature is done, or interrupted. Another tuner on the same PerfDB measuring this
        signature is waited for (PerfDB.measuring), and what it measured is reused."""
        signature = str(sp.instance.signature)
        with self.db.measuring(signature), self._cache_lock(signature):
            ours = f"part-{self.run_id}-"
            others = {name for name in self.db.names() if not name.startswith(ours)} - self.seen
            if others:  # another tuner's records: its capability verdicts are not appended twice either
                if self.reuse:
                    self._remember(_reusable(self.db, self.recorder))
                self.rejections.update(_recorded_rejections(self.db, self.recorder))
            self.seen |= others
            self._read_cache()
            return self._measure(sp, work, phase, modes, on_step, lane)

    @contextlib.contextmanager
    def _cache_lock(self, signature: str):
        """The cache's lock on `signature` (nothing when there is no cache, or it cannot be locked)."""
        with contextlib.ExitStack() as stack:
            if self.cache is not None:
                try:
                    stack.enter_context(self.cache.measuring(signature))
                except (LzError, WriteError, OSError) as e:  # (a cache folder that cannot be made, or read-only)
                    self._leave_cache(f"cannot be locked ({str(e)[:300]})")
            yield

    def _measure(self, sp: SignaturePlan, work: Work, phase: str, modes: tuple[str, ...],
                 on_step: Callable[[str], None], lane: Lane | None) -> list[dict]:
        runner, recorder = (lane.runner, lane.recorder) if lane else (self.runner, self.recorder)
        results: list[dict] = []
        fresh: list[dict] = []
        measured: list[dict] = []
        try:
            for dims, candidates in work:
                to_measure = []
                for cand in candidates:
                    key = (str(sp.instance.signature), cand.spec.kernel_id, cand.spec.version(), dims_key(dims))
                    earlier = self._reused(sp, key, modes) if cand.admitted else None
                    if not cand.admitted:
                        first, *rest = cand.reasons
                        verdict = recorder.record(sp, cand.spec, dims, stage="capability", phase=phase,
                                                       reason_code=first.code,
                                                       reason_message="; ".join([first.message, *map(str, rest)]))
                        known = self.rejections.setdefault(_rejection_key(verdict), verdict)
                        (fresh if known is verdict else results).append(known)
                    elif earlier is not None:
                        if key in self.shared or (earlier.get("cached_from") and key not in self.copied
                                                  and earlier["run_id"] != self.run_id):
                            self.shared.discard(key)
                            self.copied.add(key)  # the artifact's PerfDB holds what its table was solved from
                            fresh.append(earlier)
                        else:
                            results.append(earlier)
                        on_step(f"{sp.instance.signature.op} {cand.spec.kernel_id}")
                    else:
                        to_measure.append(cand.spec)
                if to_measure:
                    new = measure_workload(sp, dims, to_measure, runner, recorder, next(self.seeds),
                                           on_step, phase, modes)
                    # later phases of this run reuse it too: a validation shape that lands on a bucket
                    # is not timed twice (two records of one key, and a rerun could see either)
                    self._remember({_key(r): r for r in new if r["stage"] != "capability"})
                    fresh.extend(new)
                    measured.extend(new)
        finally:  # keep what was measured even when interrupted
            self.db.append(fresh, self.run_id)
            self.share(measured)
        return results + fresh

    def measure_all(self, jobs: list[tuple[SignaturePlan, Work]], phase: str, modes: tuple[str, ...] = MODES,
                    on_step: Callable[[str], None] = lambda label: None,
                    building: Callable[[], frozenset[str]] = frozenset) -> list[dict]:
        """`measure` over many signatures: one after the other on one device; on several, each
        workload (one bucket's candidates, never split) goes to the next free device, largest first,
        a device staying on the signatures it has started while they have workloads left.
        `building()`: the kernels whose modules are being built ahead (CompileAhead.building); the
        work that waits for none of them goes first (`waits`): on one device the first such
        signature in their order, asked at each; on several once, at the start (ready_first)."""
        if len(self.lanes) == 1:
            results, pending = [], list(jobs)
            while pending:
                busy = building()
                sp, work = pending.pop(next((n for n, unit in enumerate(pending) if not waits(unit, busy)), 0))
                results += self.measure(sp, work, phase, modes, on_step)
            return results
        return run_sharded(ready_first(self.order(jobs), building()), self.lanes,
                           lambda lane, unit: self.measure(*unit, phase, modes, on_step, lane),
                           group=signature_of, warm=[lane.warm for lane in self.lanes])

    def order(self, jobs: list[tuple[SignaturePlan, Work]]) -> list[tuple[SignaturePlan, Work]]:
        """The jobs in the order measure_all takes them: as given on one device; on several, the
        workloads one by one, in first_calls_apart's order."""
        if len(self.lanes) == 1:
            return jobs
        return first_calls_apart([(sp, [item]) for sp, work in jobs for item in work])

    def changes(self, plan: Plan) -> tuple[list[str], list[str]]:
        """Against the PerfDB's reusable records: the admitted candidates whose version differs from
        every recorded one (a library upgrade) and those never recorded (a new kernel), which are
        what this run measures again; the other kernels' records are reused."""
        recorded: dict[str, set] = {}
        for _, kernel_id, version, _ in self.reusable:
            recorded.setdefault(kernel_id, set()).add(version)
        specs = {c.spec.kernel_id: c.spec for sp in plan.signatures for c in sp.candidates if c.admitted}
        changed = sorted(k for k, spec in specs.items() if k in recorded and spec.version() not in recorded[k])
        return changed, sorted(k for k in specs if k not in recorded)

    @property
    def restarts(self) -> int:
        return sum(lane.runner.restarts for lane in self.lanes)


def workload_size(unit: tuple[SignaturePlan, Work]) -> float:
    """What one workload costs to measure, for ordering: its candidates times the op's work there."""
    sp, [(dims, candidates)] = unit
    sig = sp.instance.signature
    contract = CONTRACTS[sig.op]
    return sum(c.admitted for c in candidates) * (contract.flops(sig, dims) + contract.bytes_moved(sig, dims))


def first_calls_apart(units: list[tuple[SignaturePlan, Work]]) -> list[tuple[SignaturePlan, Work]]:
    """The order in which several devices take workloads: largest first, every signature's largest
    before any signature's second (the workloads of one signature share their kernels)."""
    return groups_apart(units, workload_size, signature_of)


def waits(unit: tuple[SignaturePlan, Work], building: frozenset[str]) -> bool:
    """Whether an admitted candidate of `unit` is in `building`: its first call would wait for a
    build. A cold workload tune on an H100 waited about 45 s in the grid for FlashInfer's prefill
    modules, built one after another beside it (benchmarks/runs/2026-12-06.txt), while the linears,
    which no build holds, waited behind them: measured first, they leave the builds that time."""
    return bool(building) and any(c.admitted and c.spec.kernel_id in building for _, candidates in unit[1]
                                  for c in candidates)


def ready_first(units: list[tuple[SignaturePlan, Work]], building: frozenset[str]) -> list[tuple[SignaturePlan, Work]]:
    """The units in their order, those that wait for a build (`waits`) last."""
    return sorted(units, key=lambda unit: waits(unit, building))


def signature_of(unit: tuple[SignaturePlan, Work]) -> str:
    return str(unit[0].instance.signature)


def grid_work(sp: SignaturePlan) -> tuple[SignaturePlan, Work]:
    """The signature's grid: every candidate at every bucket."""
    return sp, [(dims, sp.candidates) for dims in sp.workloads]


def tune(plan: Plan, session: Session, mode: str, on_step: Callable[[str], None] = lambda label: None,
         building: Callable[[], frozenset[str]] = frozenset) -> list[dict]:
    """Gate and measure every candidate of the plan at every grid bucket, in the table's timing
    `mode` alone, as the search, probes and validation time it: on an H100 the cold workload tune's
    grid timed both modes, and a later tune in the other mode measures what it lacks
    (benchmarks/runs/2026-12-06-e.txt). Returns this run's view of the records (new ones and reused
    ones). `on_step` follows each candidate; `building()` names the kernels whose first calls are
    being made ahead, whose signatures wait (Session.measure_all). The device's ceilings are the
    caller's to measure (measure_ceilings), once per run."""
    return session.measure_all([grid_work(sp) for sp in plan.signatures], "grid", (mode,), on_step=on_step,
                               building=building)


LEAD_MARGIN = 0.10  # off the buckets, time the kernels within this of the best at the neighbouring points
# A probe point is skipped where one kernel leads every other (the fallback too) by more than this
# at every measured point around it: no alignment cliff short of that size changes the choice
# there, and validation's random shapes still time the table's choice against the fallback. On an
# H100 a workload tune spent 103 of its 379 s on 830 probes (benchmarks/runs/2026-12-05-states-workloads.txt).
PROBE_CLEAR = 0.25


def distinct(records: list[dict]) -> list[dict]:
    """Each record once, in order: a phase's records include those it reused, this run's own too (a
    validation shape on a bucket, a probe's fallback), and a tune's summary counted them twice: 942
    records against the 877 rows the run had written."""
    seen: set[int] = set()
    return [r for r in records if not (id(r) in seen or seen.add(id(r)))]


def by_signature(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["signature"], []).append(r)
    return out


def contenders(sp: SignaturePlan, pts: Points, dims: dict, also: tuple[str, ...] = ()) -> tuple[Candidate, ...]:
    """The admitted candidates worth timing at `dims`, off the measured points `pts`: the fallback,
    the kernels within LEAD_MARGIN of the best at the measured points around `dims`, and `also`."""
    wanted = pts.leading(dims, LEAD_MARGIN) | {sp.fallback, *also}
    return tuple(c for c in sp.candidates if c.admitted and c.spec.kernel_id in wanted)


def plan_probes(plan: Plan, records: list[dict], mode: str) -> list[tuple[SignaturePlan, Work]]:
    """Per signature, the unaligned points inside (and just past) its buckets, and where cliffs start
    (past each bucket; on a GPU past each wave of its SMs), with the contenders to time there,
    judged from the bucket records: where the race is close (a second kernel within PROBE_CLEAR
    of the best at a point around). A signature where nothing but the fallback was admitted gets
    none: there is nothing to decide."""
    recs = by_signature(records)
    units = torch.cuda.get_device_properties(plan.device).multi_processor_count if plan.device.type == "cuda" else None
    out = []
    for sp in plan.signatures:
        pts = points_from(recs.get(str(sp.instance.signature), []), mode, sp.fallback, sp.instance.calls_per_forward)
        if pts.has_choice:
            at = [dims for dims in probe_points(plan.grid, sp.instance.signature.op, units)
                  if len(pts.leading(dims, PROBE_CLEAR)) > 1]
            if at:
                out.append((sp, [(dims, contenders(sp, pts, dims)) for dims in at]))
    return out


def probe(session: Session, work: list[tuple[SignaturePlan, Work]], mode: str,
          on_step: Callable[[str], None] = lambda label: None) -> list[dict]:
    """Time the contenders at the probe points (the table's timing mode alone)."""
    return session.measure_all(work, "probe", (mode,), on_step)
