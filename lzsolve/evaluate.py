"""Evaluate an artifact where it was never measured: the table's choice against the
best kernel and against PyTorch's default, on shapes between the grid buckets.

For each op signature of the table and each evaluation shape, every kernel the
tuning admitted for that signature (and the fallback) is gated and timed again,
interleaved, exactly as `tune` does; the table's choice comes from replaying its
tree. Regret is time(table choice) / time(best kernel at that shape); the gain
over the default is time(fallback) / time(table choice).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from runtime_loader import registry
from runtime_loader.hardware import device_info, hardware_signature, mismatches
from runtime_loader.ops import OPS, Signature
from runtime_loader.table import TableError, choose, read_table

from .artifact import refresh_manifest
from .errors import LzError
from .models import OpInstance
from .perfdb import PerfDB
from .tuner import Candidate, Recorder, Runner, SignaturePlan, fresh_seeds, measure_workload, new_run_id


@dataclass(frozen=True)
class PointResult:
    signature: str
    dims: dict
    chosen: str
    best: str | None
    chosen_ms: float | None
    best_ms: float | None
    fallback_ms: float | None
    problem: str | None = None  # the chosen kernel failed here: the table would be wrong at this shape

    @property
    def regret(self) -> float | None:
        return self.chosen_ms / self.best_ms if self.chosen_ms and self.best_ms else None

    @property
    def vs_default(self) -> float | None:
        return self.chosen_ms / self.fallback_ms if self.chosen_ms and self.fallback_ms else None


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
            if name not in known or not value.strip().isdigit() or int(value) < 1:
                raise LzError(f"--shapes {spec!r}: expected DIM=N[,DIM=N] with DIM in {sorted(known)} and N >= 1")
            shape[name] = int(value)
        shapes.append(shape)
    return shapes


def _points_for(op: str, buckets: dict, shapes: list[dict] | None) -> list[dict]:
    dims = set(OPS[op].dynamic)
    if shapes is not None:
        return [s for s in shapes if set(s) == dims]
    return off_grid_points(buckets)


def evaluate(folder: Path, device: torch.device, runner: Runner, shapes: list[dict] | None = None,
             on_step: Callable[[str], None] = lambda label: None) -> list[PointResult]:
    try:
        table = read_table(folder / "dispatch.json")
    except TableError as e:
        raise LzError(f"cannot evaluate {folder}: {e}") from None
    raw, mode = table.raw, table.raw["timing_mode"]
    wrong = mismatches(table.hardware, hardware_signature(device))
    if wrong:
        raise LzError(f"{folder} was tuned on other hardware or software ({wrong[0]}); evaluate it where it was tuned")
    here = device_info(device)
    run_id = "eval-" + new_run_id()
    recorder = Recorder(raw["model"]["id"], raw["model"]["tp"], raw["model"]["dtype"], device, table.hardware,
                        run_id, runner.timer)
    seeds = fresh_seeds()
    entries = {str(Signature.make(e["op"], e["static"], e["flags"], e["dtype"])): e for e in raw["ops"]}
    results, records = [], []
    for sig, tree in table.trees.items():
        entry = entries[str(sig)]
        fallback = registry.fallback_for(sig).kernel_id
        considered = sorted({k for k, c in entry.get("candidates", {}).items() if c["admitted"]} | {fallback})
        specs = [registry.get(k) for k in considered if registry.known(k)]
        specs = [s for s in specs if not s.check(sig, here)]
        sp = SignaturePlan(OpInstance(sig, tuple(entry.get("roles", ())), entry.get("calls_per_forward", 1)), (),
                           tuple(Candidate(s, ()) for s in specs))
        for dims in _points_for(sig.op, raw["buckets"].get(sig.op, {}), shapes):
            recs = measure_workload(sp, dims, specs, runner, recorder, next(seeds), on_step)
            records += recs
            results.append(_judge(str(sig), dims, choose(tree, dims), fallback, recs, mode))
    if records:  # kept beside the tuning records, for the notebook; the manifest follows
        PerfDB(folder / "perfdb").append(records, run_id)
        refresh_manifest(folder)
    return results


def _judge(signature: str, dims: dict, chosen: str, fallback: str, recs: list[dict], mode: str) -> PointResult:
    times = {r["kernel_id"]: r.get(f"{mode}_ms") for r in recs if r["status"] == "ok" and r.get(f"{mode}_ms")}
    best = min(times, key=times.get) if times else None
    problem = None
    if chosen not in times:
        rec = next((r for r in recs if r["kernel_id"] == chosen), None)
        problem = (f"{chosen} failed here: {rec['reason_code']}: {rec['reason_message']}" if rec and rec["reason_code"]
                   else f"{chosen} has no {mode} timing here")
    return PointResult(signature, dims, chosen, best, times.get(chosen), times.get(best) if best else None,
                       times.get(fallback), problem)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(results: list[PointResult]) -> dict:
    def stats(rs: list[PointResult]) -> dict:
        regrets = [r.regret for r in rs if r.regret]
        vs_default = [r.vs_default for r in rs if r.vs_default]
        return {"points": len(rs), "problems": sum(r.problem is not None for r in rs),
                "regret_geomean": geomean(regrets), "regret_worst": max(regrets) if regrets else None,
                "vs_default_geomean": geomean(vs_default), "vs_default_worst": max(vs_default) if vs_default else None}

    by_sig: dict[str, list[PointResult]] = {}
    for r in results:
        by_sig.setdefault(r.signature, []).append(r)
    return {"overall": stats(results), "signatures": {s: stats(rs) for s, rs in by_sig.items()},
            "problems": [f"{r.signature} at {r.dims}: {r.problem}" for r in results if r.problem],
            "points": [{"signature": r.signature, "dims": r.dims, "chosen": r.chosen, "best": r.best,
                        "chosen_ms": r.chosen_ms, "best_ms": r.best_ms, "fallback_ms": r.fallback_ms,
                        "regret": r.regret, "vs_default": r.vs_default} for r in results]}
