"""Tuning on a Ray cluster (`tune --ray ADDRESS`): the measurement workers of `--devices`, as Ray actors.

One actor per GPU of the cluster (`num_gpus=1`; on a CPU-only cluster `num_cpus=1` actors measuring on
cpu), each holding on its node the runner a one-host run would (a WorkerRunner, or in-process with
--no-isolate). The driver sees each actor through RayRunner, a Runner like any other, so the
scheduler (devices.run_sharded) and the Session are unchanged: results come back to the driver,
which alone builds the records and writes the PerfDB. Ray is an optional extra: it is imported
here, and only when --ray is given.
"""
from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable

import torch

from lzsolve.errors import LzError
from lzsolve.measure.harness import Budget, timer_name
from lzsolve.measure.tasks import rejected
from lzsolve.measure.worker import STARTUP_TIMEOUT_S, InProcessRunner, WorkerRunner
from runtime_loader.hardware import differing, hardware_signature
from runtime_loader.inputs import SKEW_ENV, routing_skew
from runtime_loader.specs import CRASHED, TIMEOUT

# lzsolve is on no package index: its extra installs from a clone (or Ray alone, anywhere)
INSTALL = "pip install -e '.[ray]' in the lzsolve clone, or pip install 'ray>=2.9'"
CPU_WORKERS = 2  # a CPU-only cluster (a laptop, CI): enough to exercise the sharding, not to tune

DEFAULT_BUDGET = Budget()


def import_ray():
    try:
        import ray
    except ImportError:  # not installed (or sys.modules['ray'] = None)
        raise LzError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


class Measurer:
    """The actor's body: one device of one node. Ray shows an actor with num_gpus=1 its own GPU
    alone, as cuda:0."""

    def __init__(self, kind: str, isolate: bool, plugins: tuple[str, ...], timeout_s: float, env: dict[str, str],
                 budget: Budget):
        os.environ.update(env)  # the driver's settings that inputs read (its worker process inherits them)
        device = self.device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
        self.runner = (WorkerRunner(device, budget, plugins, timeout_s) if isolate
                       else InProcessRunner(device, budget, plugins))

    def where(self) -> tuple[str, dict]:
        import ray
        return ray.util.get_node_ip_address(), hardware_signature(self.device)

    def run(self, task) -> dict:
        return self.runner.run(task)

    def close(self) -> int:
        self.runner.close()
        return self.runner.restarts


class RayRunner:
    """The driver's side of one actor (the Runner protocol). An actor that dies (a kernel took its
    process down under --no-isolate, its node was lost, it was killed) costs only the task in
    flight, rejected as CRASHED as WorkerRunner does for its worker; the next task starts a new actor."""

    def __init__(self, ray, start: Callable, kind: str, timeout_s: float):
        self._ray, self._start = ray, start  # start() -> a new actor
        # no index: records' device_index is then the lane's position, one per actor of the cluster
        self.device = torch.device(kind)
        self.timer = timer_name(self.device)
        # a safety net over the actor's own timeouts (its worker's start, then the measurement): a hung
        # actor (--no-isolate, a stuck node) is killed
        self.timeout_s = timeout_s + STARTUP_TIMEOUT_S + 60
        self.restarts = 0
        self._actor = start()

    def where(self):
        """An ObjectRef of the actor's (node address, hardware signature)."""
        return self._actor.where.remote()

    def run(self, task) -> dict:
        ray = self._ray
        if self._actor is None:
            self._actor = self._start()
            try:
                ray.get(self.where(), timeout=STARTUP_TIMEOUT_S)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
                raise LzError(f"--ray: a measurement actor could not be started again ({type(e).__name__}); records "
                              f"so far are kept: run the same command to continue") from None
        started = time.monotonic()
        try:
            return ray.get(self._actor.run.remote(task), timeout=self.timeout_s)
        except ray.exceptions.RayActorError as e:
            self._lost()
            why = (str(e).strip().splitlines() or [""])[0][:200]
            return rejected("bench", CRASHED, f"the Ray actor died after {time.monotonic() - started:.1f} s ({why})")
        except ray.exceptions.GetTimeoutError:
            ray.kill(self._actor)
            self._lost()
            return rejected("bench", TIMEOUT, f"no answer within {self.timeout_s:.0f} s; the Ray actor was killed")

    def _lost(self) -> None:
        self._actor = None
        self.restarts += 1

    def close(self, wait: bool = True) -> None:
        """The actor gives back its restarts and is killed (`wait` is the Runner protocol's: the
        driver waits for the actor's answer either way, 30 s at most)."""
        if self._actor is None:
            return
        try:  # the restarts of the worker processes under the actor count too
            self.restarts += self._ray.get(self._actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - a dying actor has nothing more to give back
            pass
        self._ray.kill(self._actor)
        self._actor = None


class Cluster:
    """A connection to a Ray cluster and the kind of device its workers measure on."""

    def __init__(self, address: str):
        ray = self.ray = import_ray()
        # already connected (a test, a notebook): use that instance, and leave it running
        self.owned = not ray.is_initialized()
        if self.owned:
            if address not in ("local", "auto") and "://" not in address:
                _check_reachable(address)
            options = {"include_dashboard": False} if address == "local" else {}
            try:
                ray.init(address=address, log_to_driver=False, **options)
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise LzError(f"--ray {address}: cannot connect to a Ray cluster "
                              f"({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}); start one with "
                              f"`ray start --head`, or use --ray local") from None
        _errors_to_stderr(ray)
        resources = ray.cluster_resources()
        self.gpus, self.cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        self.kind = "cuda" if self.gpus else "cpu"

    def runners(self, workers: int | None, isolate: bool, plugins: tuple[str, ...], timeout_s: float,
                here: dict, budget: Budget = DEFAULT_BUDGET) -> list[RayRunner]:
        """One actor per GPU (or `workers` of them), started and checked against this host's
        hardware `here` (the plan's: every record is tagged with it)."""
        ray, count = self.ray, workers or self.gpus or CPU_WORKERS
        have, unit = (self.gpus, "GPU") if self.gpus else (self.cpus, "CPU")
        if count > have:
            raise LzError(f"--ray-workers {count}: the cluster has {have} {unit}(s); one worker takes one")
        if self.kind == "cuda" and not torch.cuda.is_available():
            raise LzError("--ray: the cluster measures on GPUs but this host has none; run `lzsolve tune` on one of "
                          "its GPU nodes (the plan and the records' hardware are this host's)")
        resource = {"num_gpus": 1} if self.kind == "cuda" else {"num_cpus": 1}
        start = functools.partial(ray.remote(**resource)(Measurer).remote, self.kind, isolate, plugins, timeout_s,
                                  {SKEW_ENV: repr(routing_skew())}, budget)
        runners = [RayRunner(ray, start, self.kind, timeout_s) for _ in range(count)]
        try:
            places = ray.get([r.where() for r in runners], timeout=STARTUP_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
            close(runners)
            raise LzError(f"--ray: {count} measurement actor(s) did not start within {STARTUP_TIMEOUT_S:.0f} s "
                          f"({type(e).__name__}); check `ray status`") from None
        try:
            check_same_hardware(here, places)
        except LzError:
            close(runners)
            raise
        return runners

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()


def _check_reachable(address: str) -> None:
    """ray.init waits minutes on an address where no head listens: ask the port first."""
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit()):
        raise LzError(f"--ray {address}: not HOST:PORT (the head's address), auto or local")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        raise LzError(f"--ray {address}: no Ray head answers there ({e}); pass HOST:PORT of a node that ran "
                      f"`ray start --head` (port 6379 unless told), auto, or local") from None


def _errors_to_stderr(ray) -> None:
    """Ray prints its raylet's messages (a worker died, ...) on stdout, where `tune --json` writes its
    summary alone: send them to stderr. A private hook: a Ray without it keeps its own printing."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    show = getattr(worker, "print_to_stdstream", None)
    if show is None or getattr(show, "to_stderr", False):
        return

    def to_stderr(data: dict, ignore_prefix: bool) -> None:
        show({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True
    worker.print_to_stdstream = to_stderr


def close(runners: list[RayRunner]) -> None:
    for runner in runners:
        runner.close()


def describe(sig: dict) -> str:
    parts = (sig.get("name"), sig.get("sm") and f"sm{sig['sm']}", sig.get("isa"),
             sig.get("cuda") and f"cuda {sig['cuda']}", sig.get("torch") and f"torch {sig['torch']}")
    return ", ".join(p for p in parts if p)


def check_same_hardware(here: dict, places: list[tuple[str, dict]]) -> None:
    """One table is solved from every record, all tagged with this host's hardware: refuse nodes
    whose hardware (the fields a table must match where it is loaded) differs."""
    differ = {}
    for node, sig in places:
        fields = differing(sig, here)
        if fields:
            differ[node] = f"{node} ({describe(sig)}: {'/'.join(fields)} differ)"
    if differ:
        raise LzError(f"--ray: every node must have this host's hardware ({describe(here)}), not "
                      + "; ".join(differ.values()) + "; tune each kind of hardware in a run of its own")
