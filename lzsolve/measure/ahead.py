"""Compiling ahead: the first calls that build a module with nvcc, made by a second worker on
each device (two where the host has 16 cores a device: builders_per_device) while the first ones
search and measure.

A FlashInfer kernel's first call builds its module with nvcc: 35 s and 51 s for its two prefill
modules, 14 s and 7 s for its decode ones on the H100, where a Triton or Inductor compile takes a
second. In a cold default tune those builds were 107 s of the grid's 268 s (benchmarks/device.sh decisions),
with the GPU idle while nvcc ran on the host. Here a second worker per device makes those first
calls (each a ParityTask: a real parity check, recorded with phase 'compile' and its
jit_ms) from the start of the run, so the grid finds the modules built; a signature whose kernel is still
queued or building when the grid reaches it goes after the others (tuner.waits), and one that
holds such a kernel when the grid begins goes through the probes and validation after the others too
(pipeline.Tune.cohorts). FlashInfer guards a build
and its load with one file lock, so a worker that reaches a module still building waits for it
instead of building it twice.

The second worker's calls are small (the signature's smallest workloads), so they take the
GPU for milliseconds beside the first worker's timing; its nvcc builds take host cores, which the
graph-mode timing of a GPU run does not read.

Inductor's kernels (FlexAttention, the compile.* family) are warmed the same way on a GPU run, by
processes of their own, one per device: a process's first Inductor compile took 12-15 s per device
in the grid of a two-GPU run (benchmarks/device.sh devices), and a later process sharing the run's caches reads
most of it back (9.3 s cold against 3.2-3.3 s on this project's CPU VM,
benchmarks/first_call_cache.py). They do not join the nvcc queue, where they would delay the builds
the grid waits on. They call them at every grid workload, largest first as the grid measures:
FlexAttention compiles a graph per shape, 1.5 s a shape cold and 0.16 s from the caches another
process filled (an H100, benchmarks/first_call_cache.py), about half of each device's first calls in a two-GPU
grid (benchmarks/device.sh devices). At those workloads they make the first call alone (FirstCallTask): a reference of the
larger ones would take the GPU from the timing beside it, and the measuring worker checks the
kernel there anyway. The probes' and validation's
workloads, known only when those phases begin, are given to them then (CompileAhead.begin), in the
order the devices measure them; the grid's calls not made by then are dropped. One warmer for two
devices fell behind them: on two H200s the devices reached FlexAttention's probe shapes before it
and compiled 31 s of first calls against 24 s on one GPU (benchmarks/device.sh devices).

The rest of the optional libraries' kernels (Liger's, FlashAttention's; not the tunable ones,
whose first calls the search makes) get one more process, the primer, for the whole run: their
first calls at their branch points, from the start. What a measuring worker pays
at such a kernel's first call is mostly the library's import (Liger's about 10 s per process,
benchmarks/device.sh devices), which is slow where the interpreter has no bytecode for what it imports; the primer
writes that bytecode to the run's shared cache (lzsolve.measure.worker.share_bytecode) and compiles the
library's Triton kernels into the run's cache while the search runs, so the measuring workers read
both. One is enough: bytecode and Triton's cache are shared by every device of the run.
"""
from __future__ import annotations

import collections
import math
import os
import threading
from collections.abc import Callable, Sequence

from lzsolve.measure.tasks import FirstCallTask, ParityTask
from lzsolve.measure.tuner import Runner, Session, SignaturePlan, Work
from lzsolve.store.perfdb import dims_key
from runtime_loader import registry
from runtime_loader.jit import NVCC_BUILT
from runtime_loader.specs import KernelSpec

Call = tuple[SignaturePlan, KernelSpec, dict]  # (signature, kernel, workload)
PHASES = ("grid", "probe", "validation")  # the tune's measuring phases, in their order


def branch_points(points: tuple[dict, ...]) -> list[dict]:
    """The workloads whose first calls build what a kernel needs at every workload, as far as a
    first call can tell: the smallest, and for each dim the smallest where that dim has left its
    minimum. Kernels pick their module by such thresholds (FlashInfer's prefill: one module for
    batch 1, another for batches of several requests), not by the sizes themselves."""
    if not points:
        return []
    size = lambda p: math.prod(p.values())  # noqa: E731
    picked = [min(points, key=size)]
    for dim in points[0]:
        low = min(p[dim] for p in points)
        above = [p for p in points if p[dim] > low]
        if above:
            picked.append(min(above, key=size))
    return [p for n, p in enumerate(picked) if p not in picked[:n]]


def builders_per_device(devices: int = 1, cores: int | None = None) -> int:
    """The nvcc builders each of `devices` devices gets. One builder makes its first calls one after
    another: on an H100 host (16 cores) a cold workload tune's FlashInfer modules took 117 s in a row
    (the two prefill modules 34 and 48 s), and its grid waited about 45 s for them
    (benchmarks/runs/2026-12-06.txt), while a module is 6-10 nvcc translation units (FlashInfer
    0.5.3's prefill modules: one per mask mode, and their bindings), built in parallel but fewer
    than such a host's cores. So two builders per device where the host has 16 cores a device;
    one below, where they would take the cores the search's compiles and the eager timings need
    (one builder per device beside the search made its trials 21% slower on a host of two H200s)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 2 if cores >= 16 * devices else 1


INDUCTOR_WARMED = frozenset({"inductor"})  # the caches the warming process fills (see above)


def built_by_nvcc(spec: KernelSpec) -> bool:
    """The builders' kernels."""
    return bool(NVCC_BUILT & set(spec.jit_caches))


def warmed_by_inductor(spec: KernelSpec) -> bool:
    """The Inductor warmers' kernels."""
    return bool(INDUCTOR_WARMED & set(spec.jit_caches))


def imports_a_library(spec: KernelSpec) -> bool:
    """The primer's kernels: those of an optional library (`requires`) that nothing else calls
    first: not the builders, not the warmers, and not the search, whose trials make the tunable
    kernels' first calls. Such a kernel's first call in a process imports its library, and
    where the interpreter has no bytecode for it (lzsolve.measure.worker.share_bytecode) compiles every
    module the library imports: importing Liger's RMSNorm took 12.1 s in a process that wrote the
    run's shared bytecode and 4.4 s in one that read it (an H200 host, torch, transformers and
    PEFT without bytecode; benchmarks/import_costs.py). The measuring workers
    then read what the primer wrote, and find its Triton kernels compiled."""
    return bool(spec.requires) and not (built_by_nvcc(spec) or warmed_by_inductor(spec)
                                        or spec.kernel_id in registry.TUNABLES)


def phase_calls(jobs: list[tuple[SignaturePlan, Work]], wanted: Callable[[KernelSpec], bool]) -> list[Call]:
    """(signature, kernel, workload) of a phase's work (probes, validation) whose kernel is
    `wanted`, in the order of `jobs`: give them in the order the phase measures them
    (Session.order, validate.in_order)."""
    return [(sp, c.spec, dims) for sp, work in jobs for dims, candidates in work for c in candidates
            if c.admitted and wanted(c.spec)]


def call_key(call: Call) -> tuple[str, str, str]:
    sp, spec, dims = call
    return str(sp.instance.signature), spec.kernel_id, dims_key(dims)


def largest_first(points: tuple[dict, ...]) -> list[dict]:
    """The workloads in the order the grid measures them (tuner.first_calls_apart)."""
    return sorted(points, key=lambda p: math.prod(p.values()), reverse=True)


def first_calls(signatures: tuple[SignaturePlan, ...], session: Session,
                wanted: Callable[[KernelSpec], bool] = built_by_nvcc,
                every_workload: bool = False) -> list[tuple[SignaturePlan, KernelSpec, dict]]:
    """(signature, kernel, workload) to call ahead: the admitted kernels `wanted` (by default
    those nvcc builds), at their branch points (every_workload: at each grid workload, largest
    first), unless an earlier run of this PerfDB or the measurement cache measured that kernel
    version (its out folder holds the build, or the cache brought it: Session.bring_jit_files)."""
    measured = {(kernel_id, version) for _, kernel_id, version, _ in session.reusable}
    points = largest_first if every_workload else branch_points
    return [(sp, c.spec, dims) for sp in signatures for c in sp.candidates
            if c.admitted and wanted(c.spec)
            and (c.spec.kernel_id, c.spec.version()) not in measured
            for dims in points(sp.workloads)]


class CompileAhead:
    """The builders' threads, per_device per device of the run (each with its own worker on the
    device of one of the session's lanes, whose recorder names that device), taking the first calls
    from one queue: on two GPUs two modules build at once, where one builder would leave the
    second device's grid waiting on the first device's queue of builds. Each first call's record
    goes to the PerfDB when it is made, so a run interrupted before the builders finished keeps
    the builds' records so far.

    The queue is kept per phase (PHASES): the threads take the first call of the earliest phase
    that has one, and a call is made once whatever phases name it. The builders leave once the
    queue is empty. The Inductor warmer (every_workload) stays until closed, for the calls `add`
    and `begin` bring (its worker process, started once, keeps its compiled state)."""

    def __init__(self, calls: list[Call], session: Session, make_runners: Sequence[Callable[[], Runner]],
                 checked: bool = True, stays: bool = False, per_device: int = 1):
        self.session, self.records, self.error = session, [], None
        self.task = ParityTask if checked else FirstCallTask
        self.stays = stays
        self._stop = threading.Event()
        self._queued = {phase: collections.deque() for phase in PHASES}  # (call, seed) per phase
        self._given: set[tuple] = set()  # keys of the calls queued, in flight or made
        self._making = collections.Counter()  # the kernels of the calls in flight
        self._changed = threading.Condition()
        self.add(calls, "grid")
        # per_device threads (each its own worker) per device, the devices' first ones first
        slots = [pair for _ in range(per_device) for pair in zip(make_runners, session.lanes)][:len(calls)]
        self._threads = [threading.Thread(target=self._run, args=(make_runner, lane.recorder), daemon=True,
                                          name=f"lzsolve-compile-ahead-{n}")
                         for n, (make_runner, lane) in enumerate(slots)]
        for thread in self._threads:
            thread.start()

    @classmethod
    def start(cls, signatures: tuple[SignaturePlan, ...], session: Session,
              make_runners: Sequence[Callable[[], Runner]], wanted: Callable[[KernelSpec], bool] = built_by_nvcc,
              every_workload: bool = False, per_device: int = 1) -> CompileAhead | None:
        """every_workload: a first call at each grid workload, unchecked (FirstCallTask), and the
        warmer stays for more (add); else a parity check at each branch point. per_device: the
        threads, each with its own worker, per device (builders_per_device)."""
        calls = first_calls(signatures, session, wanted, every_workload)
        return cls(calls, session, make_runners, checked=not every_workload, stays=every_workload,
                   per_device=per_device) if calls else None

    def add(self, calls: list[Call], phase: str) -> None:
        """More first calls for `phase` (one of PHASES), after its queued ones; those given before
        are left out. From the main thread, whose seed counter it is."""
        with self._changed:
            for call in calls:
                if (key := call_key(call)) not in self._given:
                    self._given.add(key)
                    self._queued[phase].append((call, next(self.session.seeds)))
            self._changed.notify_all()

    def begin(self, phase: str, calls: list[Call], keep: frozenset[str] = frozenset()) -> None:
        """`phase` begins and makes `calls`: they come next, in this order; the calls still queued
        for the phases before it, and those queued for it that it does not make, are dropped, but
        for the earlier phases' calls of the signatures in `keep` (a later cohort's grid, still to
        come: pipeline.Tune.cohorts), which stay ahead of them."""
        with self._changed:
            for earlier in PHASES[:PHASES.index(phase)]:
                self._queued[earlier] = collections.deque(
                    (call, seed) for call, seed in self._queued[earlier] if str(call[0].instance.signature) in keep)
            queued = {call_key(call): seed for call, seed in self._queued[phase]}
            self._given -= queued.keys()  # never made
            self._queued[phase].clear()
            for call in calls:
                if (key := call_key(call)) not in self._given:
                    self._given.add(key)
                    self._queued[phase].append((call, queued[key] if key in queued else next(self.session.seeds)))
            self._changed.notify_all()

    def _next(self):
        """The next call, or None when this thread should leave."""
        with self._changed:
            while not self._stop.is_set():
                queued = next((q for q in self._queued.values() if q), None)
                if queued:
                    taken = queued.popleft()
                    self._making[taken[0][1].kernel_id] += 1
                    return taken
                if not self.stays:
                    return None
                self._changed.wait(timeout=0.2)
        return None

    def _run(self, make_runner, recorder) -> None:
        runner = None
        try:
            runner = make_runner()
            while (taken := self._next()) is not None:
                (sp, spec, dims), seed = taken
                try:
                    outcome = runner.run(self.task(sp.instance.signature, spec.kernel_id, dims, seed))
                    record = recorder.record(sp, spec, dims, seed=seed, phase="compile", **outcome)
                    self.session.db.append([record], self.session.run_id)  # each as it comes: a build is minutes
                    self.session.share([record])  # and the files it built, for later runs (jit_store)
                    self.records.append(record)
                finally:
                    with self._changed:
                        self._making[spec.kernel_id] -= 1
                        self._changed.notify_all()
        except Exception as e:  # a worker that cannot start costs the head start, never the run
            self.error = self.error or f"{type(e).__name__}: {e}"
        finally:
            if runner is not None:
                runner.close(wait=False)  # its CUDA context and cached memory go as soon as it is done, beside the run
            with self._changed:
                self._changed.notify_all()

    def building(self) -> frozenset[str]:
        """The kernels whose first calls are queued or being made (the grid measures the signatures
        they hold after the others: tuner.waits)."""
        with self._changed:
            if not any(thread.is_alive() for thread in self._threads):  # gone, whatever they left queued
                return frozenset()
            queued = {spec.kernel_id for calls in self._queued.values() for (_, spec, _), _ in calls}
            return frozenset(queued | set(+self._making))

    def wait(self) -> list[dict]:
        """Every call given so far made (or every thread gone); their records."""
        with self._changed:
            self._changed.wait_for(lambda: not (+self._making or any(self._queued.values()))
                                   or not any(t.is_alive() for t in self._threads))
        return list(self.records)

    def close(self, wait: bool = True) -> list[dict]:
        """Stop after the calls in flight. wait=False (an interrupted run) leaves those calls to
        the workers, daemon processes that end with this one."""
        self._stop.set()
        if wait:
            for thread in self._threads:
                thread.join()
        return list(self.records)

    def summary(self) -> list[dict]:
        """What each first call cost (for the run's summary)."""
        return [{"kernel_id": r["kernel_id"], "signature": r["signature"], "dims": r["dims"],
                 "jit_s": round((r.get("jit_ms") or 0) / 1e3, 1), "status": r["status"]} for r in self.records]
