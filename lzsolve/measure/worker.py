"""Crash isolation: candidates run in a worker process owned by the tuner.

A segfault, an illegal memory access, a hang or the OOM killer ends only the
worker: the task gets a Reason (CRASHED, TIMEOUT, OOM), a fresh worker starts
for the next task, and the tuning run goes on. The worker imports the same
registry (plus any --plugin modules) and runs `measure.run_task`.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lzsolve import adopt_shared_bytecode
from lzsolve.errors import LzError
from lzsolve.measure.env import Sensor
from lzsolve.measure.harness import Budget, make_harness, timer_name
from lzsolve.measure.tasks import Task, needs_restart, rejected, run_task
from runtime_loader.specs import CRASHED, OOM, TIMEOUT

STARTUP_TIMEOUT_S = 180.0
BUILDER_NICE = 10  # the compile-ahead workers' niceness (lzsolve/measure/ahead.py)


# a module whose bytecode every worker's first Inductor, Dynamo or Liger call needs
BYTECODE_PROBE = ("_dynamo", "utils.py")


def share_bytecode(folder: Path) -> bool:
    """Where this interpreter has no bytecode for torch's modules (a read-only environment, or
    PYTHONDONTWRITEBYTECODE, as in container images), every worker compiles the same sources
    again: on the H100 host that was 8-10 s of each worker's first Inductor or Liger call,
    paid once per device (benchmarks/device.sh devices). Then point the workers (this process's children)
    at one bytecode cache in `folder`, which the first to import a module fills for the others.
    Returns whether it did; where the bytecode is there, or the user chose a cache
    (PYTHONPYCACHEPREFIX), nothing changes."""
    source = Path(torch.__file__).parent.joinpath(*BYTECODE_PROBE)
    if os.environ.get("PYTHONPYCACHEPREFIX") or not source.is_file() or Path(importlib.util.cache_from_source(str(source))).is_file():
        return False
    folder.mkdir(parents=True, exist_ok=True)
    # the workers write under the run's folder only, so PYTHONDONTWRITEBYTECODE (the -B that
    # multiprocessing passes on) is lifted for them: lzsolve/__init__.py, where LZSOLVE_BYTECODE
    # names this cache
    os.environ["PYTHONPYCACHEPREFIX"] = os.environ["LZSOLVE_BYTECODE"] = str(folder.resolve())
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return True


@dataclass(frozen=True)
class Environment:
    """What the run changed in its environment since a worker process started (the JIT caches'
    folders, the shared bytecode, the routing skew: lzsolve.pipeline.Tune sets them once the plan has
    named the out folder), for a worker started before that (WorkerRunner.prestart)."""

    changed: dict[str, str]
    removed: tuple[str, ...]

    @classmethod
    def since(cls, before: dict[str, str]) -> Environment | None:
        now = dict(os.environ)
        changed = {name: value for name, value in now.items() if before.get(name) != value}
        removed = tuple(name for name in before if name not in now)
        return cls(changed, removed) if changed or removed else None

    def apply(self) -> None:
        for name in self.removed:
            os.environ.pop(name, None)
        os.environ.update(self.changed)
        adopt_shared_bytecode()


def load_plugins(modules: tuple[str, ...]) -> None:
    """Import user-named modules that register extra kernels (runtime_loader.registry.register)."""
    for name in modules:
        importlib.import_module(name)


@dataclass
class InProcessRunner:
    """Runs tasks in this process: no protection, for debugging (--no-isolate) and unit tests."""

    device: torch.device
    budget: Budget = field(default_factory=Budget)
    plugins: tuple[str, ...] = ()
    restarts: int = 0

    def __post_init__(self):
        load_plugins(self.plugins)
        with self.current():
            self.harness = make_harness(self.device, self.budget)
        self.sensor = Sensor.for_device(self.device)
        self.timer = self.harness.name

    def current(self):
        """Its device made the current one while it works: Triton and FlashInfer launch, and CUDA
        events and graphs record, on the current device, not on the one their tensors name (a
        worker for cuda:1 would otherwise time device 0's stream). Per thread, as --no-isolate's
        lanes are."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def run(self, task: Task) -> dict:
        with self.current():
            return run_task(task, self.device, self.harness, self.sensor)

    def close(self, wait: bool = True) -> None:
        pass


def own_device(device: str, visible: str | None) -> tuple[str, str | None]:
    """A worker's device and CUDA_VISIBLE_DEVICES: a GPU worker sees its GPU alone, as cuda:0 (None:
    nothing to change). Inductor's compiled graphs name their device, and its cache does too: a
    FlexAttention shape warmed on cuda:0 (lzsolve/measure/ahead.py) took the cuda:1 worker of a two-GPU run
    0.6-1.0 s to compile again where the cuda:0 worker read it back in 0.15 s (benchmarks/device.sh devices).
    `visible`: the CUDA_VISIBLE_DEVICES this process was given, whose n-th entry cuda:n is."""
    parsed = torch.device(device)
    if parsed.type != "cuda" or parsed.index is None:
        return device, None
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    return "cuda:0", entries[parsed.index] if entries else str(parsed.index)


def _serve(conn, device: str, budget: Budget, plugins: tuple[str, ...], nice: int = 0) -> None:
    """The worker's loop: announce readiness, then answer tasks until told to stop, or until the
    parent is gone (killed, say): then there is no one to answer, so the worker leaves quietly
    instead of printing a BrokenPipeError traceback into the run's log."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    mine, visible = own_device(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None and not torch.cuda.is_initialized():  # CUDA reads it once, as it starts
        os.environ["CUDA_VISIBLE_DEVICES"], device = visible, mine
    if nice and hasattr(os, "nice"):
        os.nice(nice)  # before any task: the processes its tasks start (ninja, nvcc) inherit it
    runner = InProcessRunner(torch.device(device), budget, plugins)
    try:
        conn.send({"ready": True})
        while True:
            task = conn.recv()
            if task is None:
                return
            if isinstance(task, Environment):
                task.apply()
                continue
            result = runner.run(task)
            conn.send(result)
            if needs_restart(result):
                return  # the CUDA context is gone or suspect; the parent starts a new worker
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent closed its end or died


def _death(exitcode: int | None) -> tuple[str, str]:
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode)
        if sig == signal.SIGKILL:
            return OOM, "worker was killed by SIGKILL, as the kernel's out-of-memory killer does"
        return CRASHED, f"worker died with {sig.name}"
    return CRASHED, f"worker exited with code {exitcode}"


class WorkerRunner:
    """One worker process for one device, replaced after a crash or a hang. nice: added to the
    worker's scheduling niceness (POSIX), for work that should only take the cores others leave."""

    def __init__(self, device: torch.device, budget: Budget | None = None, plugins: tuple[str, ...] = (),
                 timeout_s: float = 300.0, nice: int = 0):
        self.device, self.budget, self.plugins, self.timeout_s = device, budget or Budget(), plugins, timeout_s
        self.nice = nice
        self._ctx = mp.get_context("spawn")  # a forked CUDA context is unusable
        self._proc = None
        self._conn = None
        self._ready = False  # the process has answered that it is ready, and has the run's environment
        self._environment: dict[str, str] = {}  # this process's, as the worker process started with it
        self.timer = timer_name(device)
        self.restarts = 0

    def prestart(self) -> None:
        """Start the worker process now, before the run has set its environment: its imports and
        its device's start go on beside the planning, which names the out folder the JIT caches
        and the shared bytecode need (on an H200 host the search's first trial, which waited for
        them, took 6.8 s, and 2.6 s once they went beside the planning: benchmarks/import_costs.py). Its
        first task brings it the environment as the run then has it."""
        if self._proc is None:
            self._spawn()

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        self._environment = dict(os.environ)
        self._proc = self._ctx.Process(target=_serve, args=(child, str(self.device), self.budget, self.plugins, self.nice),
                                       daemon=True, name="lzsolve-worker")
        self._proc.start()
        child.close()
        self._conn, self._ready = parent, False

    def _start(self) -> None:
        """The worker started (if it was not), ready and given what the run changed in its
        environment since its start."""
        if self._proc is None:
            self._spawn()
        parent = self._conn
        if not parent.poll(STARTUP_TIMEOUT_S):
            self._stop()
            raise LzError(f"the measurement worker did not start within {STARTUP_TIMEOUT_S:.0f} s; try --no-isolate to see why")
        try:
            parent.recv()
        except EOFError:
            code = self._reap()
            raise LzError(f"the measurement worker failed to start ({_death(code)[1]}); try --no-isolate to see why") from None
        change = Environment.since(self._environment)
        if change:
            parent.send(change)
        self._ready = True

    def _reap(self) -> int | None:
        self._proc.join(timeout=10)
        code = self._proc.exitcode
        self._conn.close()
        self._proc = self._conn = None
        self._ready = False
        return code

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._reap()

    def run(self, task: Task) -> dict:
        if not self._ready:
            self._start()
        started = time.monotonic()
        self._conn.send(task)
        if not self._conn.poll(self.timeout_s):
            self._stop()
            self.restarts += 1
            return rejected("bench", TIMEOUT, f"no answer within {self.timeout_s:.0f} s; the worker was killed")
        try:
            result = self._conn.recv()
        except (EOFError, ConnectionResetError):
            code, message = _death(self._reap())
            self.restarts += 1
            return rejected("bench", code, f"{message} after {time.monotonic() - started:.1f} s")
        if needs_restart(result):
            self._reap()
            self.restarts += 1
        return result

    def close(self, wait: bool = True) -> None:
        """Stop the worker. wait=False: tell it to leave and return; it tears its CUDA context
        down on its own (seconds, beside the rest of the run), and this process reaps it at exit.
        One that was started ahead and never given a task (the run stopped before: bad input, say)
        is stopped at once, whatever it is still importing."""
        if self._proc is not None and self._proc.is_alive() and self._ready:
            try:
                self._conn.send(None)
                if not wait:
                    self._proc = self._conn = None
                    return
                self._proc.join(timeout=10)
            except (BrokenPipeError, OSError):
                pass
        self._stop()


def close_all(runners, wait: bool = True) -> None:
    """Close runners at once: a worker's exit (its CUDA context torn down, its interpreter shut
    down) takes seconds, and closed one after another those seconds added up per device, a part
    of the run that more devices made longer. wait=False: each is told to leave, none waited for."""
    threads = [threading.Thread(target=runner.close, args=(wait,), name="lzsolve-close") for runner in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
