"""Evaluate an artifact where it was never measured: the table's choice against the
best kernel and against PyTorch's default, on random shapes (`--random N`: inside the
buckets and up to 1.5x past the largest, mostly no power of two), on given shapes, or
on the geometric midpoints between buckets.

For each op signature of the table and each evaluation shape, every kernel the
tuning admitted for that signature (and the fallback) is gated and timed again,
interleaved, exactly as `tune` does, in the table's timing mode; the table's choice
comes from replaying its tree. Regret is time(table choice) / time(best kernel at that
shape); vs default is time(table choice) / time(fallback). Where the choice loses by LOSS
to either, those kernels are timed once more (`retimed`) before the shape is judged.
"""
from __future__ import annotations

import fnmatch
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from lzsolve.decide.validate import LOSS, PointResult, judge
from lzsolve.errors import LzError
from lzsolve.measure.grid import random_points
from lzsolve.measure.tuner import Candidate, Recorder, Runner, SignaturePlan, fresh_seeds, measure_workload, new_run_id
from lzsolve.models import OpInstance
from lzsolve.store.artifact import refresh_manifest
from lzsolve.store.perfdb import PerfDB
from runtime_loader import Dispatcher, registry
from runtime_loader.hardware import device_info, differences, hardware_signature
from runtime_loader.ops import OPS, Signature
from runtime_loader.table import MAX_BUCKET, TableError, choose, read_table


def between(values: list[int]) -> list[int]:
    """Geometric midpoints of neighbouring buckets that are not buckets themselves."""
    mids = [round(math.sqrt(a * b)) for a, b in zip(values, values[1:])]
    return sorted({m for m in mids if m not in values and m >= 1})


def off_grid_points(buckets: dict[str, list[int]]) -> list[dict]:
    """Every combination of midpoints; a dim with no room between its buckets keeps its
    buckets, so each point is off the grid in at least one dim."""
    mids = {dim: between(sorted(values)) for dim, values in buckets.items()}
    if not any(mids.values()):
        return []
    per_dim = {dim: mids[dim] or sorted(buckets[dim]) for dim in buckets}
    return [dict(zip(per_dim, point)) for point in itertools.product(*per_dim.values())]


def parse_shapes(specs: tuple[str, ...]) -> list[dict]:
    """'tokens=24' or 'batch=2,seq=700' -> [{'tokens': 24}, {'batch': 2, 'seq': 700}]."""
    shapes = []
    known = {d for schema in OPS.values() for d in schema.dynamic}
    for spec in specs:
        shape = {}
        for part in spec.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in known or not value.strip().isdigit() or not 1 <= int(value) <= MAX_BUCKET:
                raise LzError(f"--shapes {spec!r}: expected DIM=N[,DIM=N] with DIM in {sorted(known)} and "
                              f"1 <= N <= {MAX_BUCKET:,}")
            shape[name] = int(value)
        shapes.append(shape)
    return shapes


def _points_for(sig: Signature, buckets: dict, shapes: list[dict] | None, random_n: int, seed: int) -> list[dict]:
    if shapes is not None:
        return [s for s in shapes if set(s) == set(sig.schema.dynamic)]
    if random_n:
        return random_points(buckets, random_n, random.Random(f"{seed}:{sig}"))
    return off_grid_points(buckets)


def evaluate(folder: Path, device: torch.device, runner: Runner, shapes: list[dict] | None = None,
             on_step: Callable[[str], None] = lambda label: None, random_n: int = 0, seed: int = 0,
             op_glob: str = "*", on_this_gpu: bool = False) -> list[PointResult]:
    """`random_n` > 0: that many random shapes per op signature, drawn from `seed` and the
    signature; else `shapes`, else the midpoints between buckets. `op_glob` picks signatures
    (by signature or op name). on_this_gpu: the table may come from another device of this
    architecture, or other software; the choice at each shape is then what the runtime serves here
    (Dispatcher: stale kernels replaced by the next ranked one or the fallback), and the records,
    of this machine, stay out of the artifact."""
    try:
        table = read_table(folder / "dispatch.json")
    except TableError as e:
        raise LzError(f"cannot evaluate {folder}: {e}") from None
    raw, mode = table.raw, table.raw["timing_mode"]
    signature = hardware_signature(device)
    here_differs = differences(table.hardware, signature)
    if here_differs.refused:
        raise LzError(f"{folder} was tuned on another architecture ({here_differs.refused[0]}); no measurement of it "
                      "holds here: tune on this machine")
    wrong = here_differs.borrowed + [f"{k}: table {v[0]!r} vs here {v[1]!r}" for k, v in here_differs.stack.items()]
    if wrong and not on_this_gpu:
        raise LzError(f"{folder} was tuned on other hardware or software ({wrong[0]}); evaluate it where it was tuned, "
                      "or pass --on-this-gpu to measure here what it serves here")
    served_here = Dispatcher(table, stack=here_differs.stack) if on_this_gpu else None
    here = device_info(device)
    run_id = "eval-" + new_run_id()
    recorder = Recorder(raw["model"]["id"], raw["model"]["tp"], raw["model"]["dtype"], device,
                        signature if on_this_gpu else table.hardware, run_id, runner.timer)
    seeds = fresh_seeds()
    entries = {str(Signature.make(e["op"], e["static"], e["flags"], e["dtype"])): e for e in raw["ops"]}
    results, written = [], False
    db = PerfDB(folder / "perfdb")
    try:
        for sig, tree in table.trees.items():
            if not (fnmatch.fnmatchcase(str(sig), op_glob) or fnmatch.fnmatchcase(sig.op, op_glob)):
                continue
            sp = _evaluation_plan(sig, entries[str(sig)], here)
            specs = [c.spec for c in sp.candidates]
            records: list[dict] = []
            try:
                for dims in _points_for(sig, raw["buckets"].get(sig.op, {}), shapes, random_n, seed):
                    def measure(kernels: list, sp=sp, dims=dims) -> list[dict]:  # this point's, retimed too
                        return measure_workload(sp, dims, kernels, runner, recorder, next(seeds), on_step,
                                                "evaluate", (mode,))
                    recs = measure(specs)
                    chosen = served_here.kernel_at(sig, dims) if served_here else choose(tree, dims)
                    result = judge(str(sig), dims, chosen, sp.fallback, recs, mode, sp.instance.calls_per_forward)
                    result, recs = retimed(result, recs, measure, mode, sp.instance.calls_per_forward)
                    records += recs
                    results.append(result)
            finally:  # kept beside the tuning records (for the notebook), one signature at a time; not a
                # borrowed table's: the artifact's records are of the device it was tuned on
                written = not on_this_gpu and db.append(records, run_id) is not None or written
    finally:
        if written:
            refresh_manifest(folder)
    return results


def retimed(result: PointResult, recs: list[dict], measure: Callable[[list], list[dict]],
            mode: str, calls_per_forward: int = 1) -> tuple[PointResult, list[dict]]:
    """A loss by LOSS, timed again: the choice, the best kernel and the fallback, interleaved once
    more on fresh inputs, each counted at the faster of its two timings. One timing of a few us can
    be off by 10% (two calls of one cuBLAS GEMM, F.linear and matmul, were 1.012 and 1.115 ms
    apart in one run, and level at every other shape, benchmarks/device.sh decisions); a cliff shows twice. The
    first loss is kept in the result (`first_loss`) and both timings in the PerfDB."""
    if result.loss <= 1 + LOSS:
        return result, recs
    again = {result.chosen, result.best, result.fallback}
    recs = recs + measure([registry.get(k) for k in sorted(k for k in again if k and registry.known(k))])
    return replace(judge(result.signature, result.dims, result.chosen, result.fallback, recs, mode, calls_per_forward),
                   first_loss=result.loss), recs


def _evaluation_plan(sig: Signature, entry: dict, here) -> SignaturePlan:
    """Every kernel the tuning admitted for the signature, and its fallback, that still passes
    the capability gate here."""
    fallback = registry.fallback_for(sig).kernel_id
    considered = sorted({k for k, c in entry.get("candidates", {}).items() if c["admitted"]} | {fallback})
    specs = [registry.get(k) for k in considered if registry.known(k)]
    return SignaturePlan(OpInstance(sig, tuple(entry.get("roles", ())), entry.get("calls_per_forward", 1)), (),
                         tuple(Candidate(s, ()) for s in specs if not s.check(sig, here)))
