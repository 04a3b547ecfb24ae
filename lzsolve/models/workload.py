"""Workloads: a model as a recording saw it (`runtime_loader.record`), for `tune --workload`.

The op signatures are the ones the recorded run called, exactly; the buckets of each op's
dynamic dims are placed where its recorded shapes fall, weighted by how often each shape was
called, with as many buckets per dim as the chosen --grid has (so --grid still sets the cost).
The shapes are per rank already (the process that recorded ran them), so there is no --tp.
"""
from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lzsolve.errors import LzError
from lzsolve.limits import MAX_WORKLOAD_BYTES, MAX_WORKLOAD_DEPTH, check_ints
from lzsolve.measure.grid import Grid, buckets
from lzsolve.models.capture import Captured, OpInstance
from runtime_loader import safeio
from runtime_loader.ops import OPS, Signature
from runtime_loader.recording import FORMAT, VERSION
from runtime_loader.schema import same_json


@dataclass(frozen=True)
class Workload:
    name: str
    path: str
    calls: dict[Signature, Counter]  # signature -> Counter of dims (tuples of (dim, value))
    outside: tuple[str, ...]  # notes: calls no signature describes
    digest: str

    @property
    def dtypes(self) -> set[str]:
        return {sig.dtype for sig in self.calls}


def read(path: str | Path) -> Workload:
    """A workload file, checked: one-line LzError naming what is wrong."""
    path = Path(path)
    what = f"workload {path}"
    raw = safeio.read_regular(path, MAX_WORKLOAD_BYTES, LzError, what=what)
    data = safeio.parse_json(raw, MAX_WORKLOAD_DEPTH, LzError, what)
    check_ints(data, what)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LzError(f"{path} is not a workload file (no \"format\": \"{FORMAT}\"); "
                      "record one with runtime_loader.record(path)")
    if not same_json(data.get("version"), VERSION):
        raise LzError(f"{path}: workload version {data.get('version')!r}, this lzsolve reads {VERSION}; "
                      "record it again")
    calls: dict[Signature, Counter] = {}
    try:
        for i, call in enumerate(data["calls"]):
            s = call["signature"]
            sig = Signature.from_data(s["op"], s["static"], s["flags"], s["dtype"])
            dims = call["dims"]
            if set(dims) != set(OPS[sig.op].dynamic) or not all(map(_positive, dims.values())):
                raise ValueError(f"call {i}: dims {dims} are not positive ints for {OPS[sig.op].dynamic}")
            count = call["count"]
            if not _positive(count):
                raise ValueError(f"call {i}: count {count!r} is not a positive int")
            calls.setdefault(sig, Counter())[tuple(sorted(dims.items()))] += count
        outside = tuple(f"{o['count']} {'/'.join(o['ops'])} call(s) outside every op signature (chunked prefill, "
                        f"padding masks...) ran {o['kernel']}: not tuned" for o in data.get("outside", []))
    except (KeyError, TypeError, ValueError) as e:
        raise LzError(f"{path}: malformed workload ({type(e).__name__}: {e}); record it again") from None
    if not calls:
        raise LzError(f"{path}: the workload recorded no call a table can serve; record a run that calls a "
                      "Dispatcher (through runtime_loader.custom_ops or a patched model)")
    name = data.get("name") if isinstance(data.get("name"), str) and data.get("name") else path.stem
    return Workload(name, str(path), calls, outside, hashlib.sha256(raw).hexdigest()[:16])


def _positive(value) -> bool:
    """A JSON integer above 0 (true is 1 to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def captured(workload: Workload) -> Captured:
    """The workload as a model: one op instance per recorded signature. Its calls per forward are
    the recorded calls per recorded shape: what one forward makes of the signature at one shape
    (its layers; decode's kv_len is new every step), so what one plan of a call layout serves
    (solve.client_ms)."""
    instances = tuple(OpInstance(sig, ("recorded",), max(1, round(sum(counts.values()) / len(counts))))
                      for sig, counts in sorted(workload.calls.items(), key=lambda kv: str(kv[0])))
    total = sum(n for counts in workload.calls.values() for n in counts.values())
    summary = (f"{workload.name}: recorded workload {workload.path}, {len(instances)} op signatures, "
               f"{total} calls")
    return Captured(workload.name, "workload", 1, instances, workload.outside, workload.digest, summary)


def placed(values: Counter, budget: int) -> list[int]:
    """`budget` values out of the recorded ones (value -> calls): the smallest, the largest and
    between them the values at evenly spaced shares of the calls (weighted quantiles), so
    buckets crowd where calls crowd; every value when there are no more than `budget`. One value
    is the largest: the runtime serves calls past the range a table was tuned over (its largest
    bucket, runtime_loader.table.PAST_GRID) with the fallback, and every recorded call is inside it."""
    distinct = sorted(values)
    if len(distinct) <= budget:
        return distinct
    shares = [1.0] if budget == 1 else [i / (budget - 1) for i in range(budget)]
    total = sum(values.values())
    cumulative = [(calls / total, v) for calls, v in zip(itertools.accumulate(values[v] for v in distinct), distinct)]
    chosen = {next(v for share_so_far, v in cumulative if share_so_far >= share - 1e-12) for share in shares}
    for v in sorted(distinct, key=lambda v: -values[v]):  # quantiles that coincide: the most called values next
        if len(chosen) == budget:
            break
        chosen.add(v)
    return sorted(chosen)


def grid(workload: Workload, like: str) -> Grid:
    """Buckets per op at the recorded values of each dynamic dim, as many per dim as grid `like` has."""
    per_op: dict[str, dict[str, Counter]] = {}
    for sig, counts in workload.calls.items():
        dims = per_op.setdefault(sig.op, {d: Counter() for d in OPS[sig.op].dynamic})
        for point, n in counts.items():
            for dim, value in point:
                dims[dim][value] += n
    values = {op: {dim: placed(counter, len(buckets(like, op)[dim])) for dim, counter in dims.items()}
              for op, dims in per_op.items()}
    return Grid(f"workload/{like}", values)

