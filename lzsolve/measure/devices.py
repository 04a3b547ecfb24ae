"""Tuning on several devices of one host (`tune --devices cuda:0,cuda:1 | all`).

One worker per device (the same isolation as one device); workloads go to whichever
device is free next, largest first, so the devices finish together. A workload, all
the candidates of one (signature, bucket), is never split: its interleaved timing
stays within one GPU. Every record names its device (`device`, `device_index`), and
the table is solved from all of them as one PerfDB: the devices must therefore be the
same model.
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from lzsolve.errors import LzError

Lane = TypeVar("Lane")
Unit = TypeVar("Unit")


def resolve_device(value: str | None) -> torch.device:
    """`--device`: cpu, cuda or cuda:N, checked against this host (None: cuda if available, else cpu)."""
    if value is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise LzError(f"--device {value!r} is not a device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise LzError(f"--device {value!r} is not supported; use cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise LzError(f"--device {value}: no CUDA device is available here (torch {torch.__version__}); "
                          "use --device cpu")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise LzError(f"--device {value}: only {torch.cuda.device_count()} CUDA device(s) here")
        device = torch.device("cuda", index)
    return device


def parse_devices(text: str) -> list[torch.device]:
    """`all` (every CUDA device) or a comma-separated list of devices of one type."""
    if text.strip() == "all":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise LzError("--devices all: no CUDA device is available here; name the devices (cpu,cpu) or use --device")
        return [torch.device("cuda", i) for i in range(count)]
    devices = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            device = torch.device(part)
        except RuntimeError:
            raise LzError(f"--devices: {part!r} is not a device; use cuda:0,cuda:1 or all") from None
        if device.type not in ("cpu", "cuda") or (device.type == "cuda" and device.index is None):
            raise LzError(f"--devices: {part!r} is not supported; name each GPU with its index (cuda:0,cuda:1)")
        devices.append(device)
    if not devices:
        raise LzError("--devices: no device named; use cuda:0,cuda:1 or all")
    if len({d.type for d in devices}) > 1:
        raise LzError(f"--devices {text}: one run tunes one kind of device, not {' and '.join(sorted({d.type for d in devices}))}")
    if devices[0].type == "cuda":
        duplicated = sorted({str(d) for d in devices if devices.count(d) > 1})
        if duplicated:
            raise LzError(f"--devices: {', '.join(duplicated)} named twice; a GPU takes one worker")
        missing = [str(d) for d in devices if d.index >= torch.cuda.device_count()]
        if missing:
            raise LzError(f"--devices: {', '.join(missing)} not available here "
                          f"({torch.cuda.device_count()} CUDA device(s))")
    return devices


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def check_same_model(devices: Sequence[torch.device], name_of: Callable[[torch.device], str] | None = None) -> None:
    """One table is solved from every device's records: refuse devices of different models."""
    names = {str(d): (name_of or device_name)(d) for d in devices}
    if len(set(names.values())) > 1:
        raise LzError("--devices: the devices of one run must be the same model, not "
                      + ", ".join(f"{d} ({name})" for d, name in names.items())
                      + "; tune each model in a run of its own")


def device_index(device: torch.device, position: int) -> int:
    """The CUDA ordinal; for devices without one (cpu), the position in --devices."""
    return device.index if device.index is not None else position


def groups_apart(units: Sequence[Unit], size: Callable[[Unit], float], group: Callable[[Unit], str]) -> list[Unit]:
    """The order in which several devices take units: the largest first, except that every group's
    largest comes before any group's second. The units of one group share kernels, and a kernel's
    first call in each worker compiles it (FlashInfer's prefill module: 71 s on the H100; a search of
    Triton's linear took 25 s, not 13 s, while two devices compiled its configurations at once):
    devices that all start on one group compile the same kernels at once, each for itself; started
    on different groups, they compile different ones, and a group's later units find them in the
    disk caches (benchmarks/device.sh devices)."""
    first, rest, seen = [], [], set()
    for unit in sorted(units, key=size, reverse=True):
        (rest if group(unit) in seen else first).append(unit)
        seen.add(group(unit))
    return first + rest


def run_sharded(units: Sequence[Unit], lanes: Sequence[Lane], work: Callable[[Lane, Unit], list],
                group: Callable[[Unit], str] | None = None, warm: Sequence[set] | None = None,
                joinable: Callable[[Unit], bool] | None = None) -> list:
    """Every unit through `work`, each lane (one device) taking the next unit as soon as it is free,
    in the order given (groups_apart's, say). With `group`, a lane takes the next unit of a group it
    has already worked on while there is one, and the next of any group after that: its worker has
    made those kernels' first calls (a compile, a module load, per process), which another lane
    would make again. `warm` (a set per lane, kept by the caller) carries those groups from one
    call to the next, as a tune's phases go from the grid to probes. With `joinable`, a lane that
    finds the queue empty joins a unit another lane is working on while joinable(unit) says part of
    it is left (`work` must then take its part only: a family's search, bucket by bucket): units
    are not all alike, and the last one taken held one device for 14 s while the other idled, in
    the search of a two-GPU tune (benchmarks/device.sh devices). The first lane runs in this
    thread, so Ctrl-C lands here; on any error the other lanes finish their in-flight unit, take no
    more, and the error is raised. Returns every result, in the order they were done."""
    # each unit's group once (a signature's str() is a microsecond), and how many of each are queued,
    # so that a lane whose groups are done takes the next unit without scanning the queue
    queue = collections.deque((group(unit) if group else None, unit) for unit in units)
    queued = collections.Counter(name for name, _ in queue)
    results, errors, in_flight = [], [], []
    lock, stop = threading.Lock(), threading.Event()

    def take(warm: set) -> tuple[str | None, Unit]:
        if any(queued[name] for name in warm):
            for n, (name, unit) in enumerate(queue):
                if name in warm:
                    del queue[n]
                    return name, unit
        return queue.popleft()

    def drain(lane, warm: set) -> None:
        while not stop.is_set():
            with lock:
                if queue:
                    name, unit = take(warm)
                    queued[name] -= 1
                    if group is not None:
                        warm.add(name)
                else:  # help with a unit in flight, the one begun first (the most likely to be long)
                    unit = next((u for u in in_flight if joinable and joinable(u)), None)
                    if unit is None:
                        return
                in_flight.append(unit)
            try:
                done = work(lane, unit)
            except BaseException as e:  # handed to the caller's thread
                errors.append(e)
                stop.set()
                return
            finally:
                with lock:
                    in_flight.remove(unit)
            with lock:
                results.extend(done)

    warm = warm if warm is not None else [set() for _ in lanes]
    helpers = [threading.Thread(target=drain, args=(lane, warm[n]), daemon=True, name=f"lzsolve-lane-{n}")
               for n, lane in enumerate(lanes[1:], 1)]
    for thread in helpers:
        thread.start()
    drain(lanes[0], warm[0])
    for thread in helpers:
        thread.join()
    if errors:
        raise errors[0]
    return results
