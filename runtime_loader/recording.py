"""Record mode: the op signatures and shapes a real workload sends to the Dispatcher.

    with runtime_loader.record("workload.json"):
        model.generate(...)    # any code that calls a Dispatcher: directly, through
                               # torch.ops.lzsolve.*, or through a patched HF model

writes, for every call any Dispatcher resolved while the block ran, its op signature, its
dynamic dims (tokens, batch x seq, batch x kv_len), how many calls had them, and the kernel that
served them (from the table, or the fallback). `lzsolve tune --workload workload.json` tunes
exactly those signatures, with buckets where the recorded shapes fall, and `lzsolve plan
--workload` shows the plan. A Dispatcher(None) records too: no table is needed to record.

While recording nothing is cached, so every call is counted: record a representative run,
not a server under load. The file is written when the block ends, also when it raises (what
ran was recorded), through a temporary file, so a reader never sees half of it.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import torch

from . import dispatcher, safeio
from .specs import KernelSpec

FORMAT, VERSION = "lzsolve-workload", 1


class Recording:
    """Call counts by (signature, dims, kernel, from the table); calls outside every signature by kernel."""

    def __init__(self, name: str):
        self.name = name
        self.calls: Counter = Counter()
        self.outside: Counter = Counter()
        self._tracked: list[tuple] = []  # (call, spec, from the table, the entry's counter): see track
        self._lock = threading.Lock()

    def count(self, call, spec: KernelSpec, from_table: bool, n: int = 1) -> None:
        with self._lock:
            if call is None:
                self.outside[(spec.kernel_id, tuple(sorted(spec.ops)))] += n
            elif 0 in call[1].values():  # an empty input: the fallback's always, never tuned (a workload's dims are >= 1)
                self.outside[(spec.kernel_id, (call[0].op,))] += n
            else:
                sig, dims = call[:2]  # (a third item: why the table does not serve it, OpSchema.read)
                self.calls[(sig, tuple(dims.items()), spec.kernel_id, from_table)] += n

    def track(self, call, spec: KernelSpec, from_table: bool, calls) -> None:
        """A Dispatcher entry resolved while recording: its calls are counted on its counter (an
        itertools.count, as the Dispatcher counts every call) and added here when the recording stops
        (flush), so a recorded call costs what a served one does, not a resolution."""
        with self._lock:
            self._tracked.append((call, spec, from_table, calls))

    def flush(self) -> None:
        """The tracked entries' calls, counted (once: their counters are dropped)."""
        with self._lock:
            tracked, self._tracked = self._tracked, []
        for call, spec, from_table, calls in tracked:
            n = dispatcher.counted(calls)
            if n:
                self.count(call, spec, from_table, n)

    def to_json(self) -> dict:
        with self._lock:
            calls = [{"signature": sig.to_json(), "name": str(sig), "dims": dict(dims), "count": n,
                      "kernel": kernel_id, "served": "table" if from_table else "fallback"}
                     for (sig, dims, kernel_id, from_table), n in self.calls.items()]
            outside = [{"ops": list(ops), "kernel": kernel_id, "count": n}
                       for (kernel_id, ops), n in self.outside.items()]
        calls.sort(key=lambda c: (c["name"], sorted(c["dims"].items())))
        return {"format": FORMAT, "version": VERSION, "name": self.name,
                "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "torch": torch.__version__, "calls": calls, "outside": outside}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safeio.write_whole(path, json.dumps(data, indent=1).encode())


def _writable(path: Path) -> None:
    """Raise ValueError now, before the block runs, where `path` cannot take the recording at its end
    (a folder, a device, a file where its folder should be): else the whole run was recorded for
    nothing, and the write's error hid the block's own."""
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if path.exists() and not path.is_file():
        raise ValueError(f"record({str(path)!r}): that is not a regular file (a folder, a device or a pipe); "
                         "name a .json file to write")
    if not parent.is_dir():
        raise ValueError(f"record({str(path)!r}): {str(parent)!r} is a file, not a folder; name a path under a folder")


@contextmanager
def record(path: str | Path, name: str | None = None):
    """Record every Dispatcher call in the block to `path` (JSON); `name` names the workload
    (and the artifact a tune of it writes), by default the file's stem. Yields the Recording.
    The file is written when the block ends, also when it raises (what ran is kept; a failed
    write then warns instead of hiding the block's error). A path that cannot be written is a
    ValueError at once."""
    path = Path(path)
    _writable(path)
    recording = Recording(name or path.stem)
    dispatcher.start_recording(recording)
    try:
        yield recording
    except BaseException:
        dispatcher.stop_recording()
        try:
            _write(path, recording.to_json())
        except OSError as e:
            safeio.warn(f"lzsolve: the recording could not be written to {path}: {e}", stacklevel=3)
        raise
    dispatcher.stop_recording()
    _write(path, recording.to_json())
