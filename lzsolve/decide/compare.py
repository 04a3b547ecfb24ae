"""Compare an artifact with a previous one: did the serving stack get slower?

For every op signature both tables serve, and every grid point both measured, the
ratio time(new table's choice) / time(old table's choice), each time taken from its
own artifact's PerfDB (the records its table was solved from). A signature regressed
when the geometric mean of its ratios exceeds 1 + threshold; single points are
reported but do not fail the gate, because one point's noise is larger than a
signature's. Points where both times are under `min_ms` are reported and not gated:
between two H100 runs of one stack, kernels of 2-3 µs moved by up to 23%.
Runs on different GPU models, dtypes or timing modes are not comparable.

A signature past the allowance is *inconclusive*, not regressed, when the noise is larger than the
change: its timings spread more than it changed (IQR / median of a timing's samples, the larger of
the two runs' at a point, the median over the gated points), or most of its gated points were timed
on a busy machine, in either run (env.busy: the host's load past its cores on CPU, other programs on
the GPU), where a timing measures the share of the machine it got. On a busy 2-core VM two
identical CI runs had 'regressed' by 349x on norm.rms; spinning processes beside a tune made two
linears 'regress' 52x and 9.7x at spreads of 37% and 725%. `lzsolve compare`, `tune --baseline` and
the CI step exit 5 for it: "inconclusive: the host was too busy to judge".
"""
from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import NamedTuple

from lzsolve.decide.validate import geomean
from lzsolve.errors import LzError
from lzsolve.measure.env import busy
from lzsolve.store.perfdb import PerfDB
from runtime_loader.safeio import shown
from runtime_loader.table import TableError, choose, finite_number, read_table

# Three pairs of H100 tunes of one stack on the tiny grid (ci/tune_artifacts.py): norms, SwiGLU and
# RoPE (1.6-3.1 µs kernels at tokens <= 16) moved by up to 21% in a signature's geomean, the
# embedding (a 7 µs gather) by 61% once; linears (19 µs and more) by at most 3.2%.
DEFAULT_THRESHOLD = 0.10
DEFAULT_MIN_MS = 0.010


class Timed(NamedTuple):
    kernel_id: str
    ms: float
    spread: float  # IQR / median of its samples
    busy: bool  # timed on a busy machine (env.busy)


def chosen_times(folder: Path) -> tuple[dict, dict[str, dict[str, Timed]]]:
    """(the table, signature -> dims key -> the chosen kernel's timing) at every grid point the
    table's run measured. Records are those the table could have been solved
    from: same hardware, written before it, not from `lzsolve evaluate`; the latest wins,
    as when `tune` reuses records."""
    try:
        table = read_table(folder / "dispatch.json")
    except TableError as e:
        raise LzError(f"cannot compare {folder}: {e}") from None
    raw = table.raw
    mode = raw["timing_mode"]
    missing = [field for field in ("created_at", "hw_slug", "run_id") if not isinstance(raw.get(field), str)]
    if missing:  # optional in the schema, written by every tune: which records solved the table
        raise LzError(f"cannot compare {folder}: its table has no {', '.join(missing)}; compare artifacts "
                      "`lzsolve tune` wrote")
    try:
        created = dt.datetime.fromisoformat(raw["created_at"]).astimezone(dt.timezone.utc).replace(tzinfo=None)
    except ValueError:
        raise LzError(f"cannot compare {folder}: its created_at {shown(raw['created_at'])} is not an ISO date; "
                      "compare artifacts `lzsolve tune` wrote") from None
    rows = PerfDB(folder / "perfdb").rows(
        f"SELECT signature, kernel_id, dims, {mode}_ms AS ms, coalesce({mode}_spread, 0) AS spread, device, "
        f"host_load, gpu_others FROM admitted WHERE hw_slug = ? AND ts <= ? "
        f"AND run_id NOT LIKE 'eval-%' AND {mode}_ms IS NOT NULL ORDER BY ts",
        [raw["hw_slug"], created + dt.timedelta(seconds=1)])  # created_at is truncated to seconds
    latest = {(r["signature"], r["kernel_id"], r["dims"]): r for r in rows}
    trees = {str(sig): tree for sig, tree in table.trees.items()}
    times: dict[str, dict[str, Timed]] = {}
    for (signature, kernel_id, dims), r in latest.items():
        if signature in trees and kernel_id == _chosen(trees[signature], dims) and finite_number(r["ms"]) is not None:
            times.setdefault(signature, {})[dims] = Timed(kernel_id, r["ms"], r["spread"], busy(r))
    return raw, times


def _chosen(tree, dims: str) -> str | None:
    """The kernel the tree names at a record's dims; None where they are not a point it reads (an
    object of numbers naming the dims it splits on: a PerfDB is data too)."""
    try:
        point = json.loads(dims)
        return choose(tree, point) if all(finite_number(v) is not None for v in point.values()) else None
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _comparable(new: dict, old: dict) -> None:
    checks = [("GPU", new["hardware"].get("name"), old["hardware"].get("name")),
              ("model", new["model"]["id"], old["model"]["id"]), ("tp", new["model"]["tp"], old["model"]["tp"]),
              ("dtype", new["model"]["dtype"], old["model"]["dtype"]),
              ("timing mode", new["timing_mode"], old["timing_mode"])]
    for what, a, b in checks:
        if a != b:
            raise LzError(f"the baseline's {what} is {b}, this artifact's is {a}; compare artifacts of the same "
                          "model, tp, dtype, GPU and timing mode")


def compare(new_folder: Path, old_folder: Path, threshold: float = DEFAULT_THRESHOLD,
            min_ms: float = DEFAULT_MIN_MS) -> dict:
    """Per signature: points compared, geomean and worst ratio new/old over all of them, the
    geomean over the gated ones (either time at least min_ms), their noise (the median of the larger
    spread of the two timings at each) and how many were timed on a busy machine, and whether it
    regressed: past the allowance by more than that noise, most points timed on a quiet machine;
    else, past it, it is inconclusive."""
    new, new_times = chosen_times(Path(new_folder))
    old, old_times = chosen_times(Path(old_folder))
    _comparable(new, old)
    signatures, all_ratios = {}, []
    for sig in sorted(set(new_times) & set(old_times)):
        common = sorted(set(new_times[sig]) & set(old_times[sig]))
        ratios = {d: new_times[sig][d].ms / old_times[sig][d].ms for d in common}
        if not ratios:
            continue
        gated_at = [d for d in ratios if max(new_times[sig][d].ms, old_times[sig][d].ms) >= min_ms]
        gated = [ratios[d] for d in gated_at]
        noise = statistics.median(max(new_times[sig][d].spread, old_times[sig][d].spread) for d in gated_at) \
            if gated_at else None
        busy_points = sum(new_times[sig][d].busy or old_times[sig][d].busy for d in gated_at)
        past = bool(gated) and geomean(gated) > 1 + threshold
        inconclusive = past and (noise >= geomean(gated) - 1 or 2 * busy_points >= len(gated_at))
        worst = max(ratios, key=ratios.get)
        signatures[sig] = {
            "points": len(ratios), "ratio_geomean": geomean(list(ratios.values())), "ratio_worst": ratios[worst],
            "worst_at": json.loads(worst), "gated_points": len(gated), "gated_geomean": geomean(gated),
            "noise": noise, "busy_points": busy_points,
            "kernels_new": sorted({new_times[sig][d].kernel_id for d in common}),
            "kernels_old": sorted({old_times[sig][d].kernel_id for d in common}),
            "regressed": past and not inconclusive, "inconclusive": inconclusive,
        }
        all_ratios += ratios.values()
    return {
        "baseline": str(old_folder), "baseline_run": old["run_id"], "threshold": threshold, "min_ms": min_ms,
        "timing_mode": new["timing_mode"],
        "overall": {"points": len(all_ratios), "ratio_geomean": geomean(all_ratios)},
        "signatures": signatures,
        "regressed": sorted(s for s, v in signatures.items() if v["regressed"]),
        "inconclusive": sorted(s for s, v in signatures.items() if v["inconclusive"]),
        "only_new": sorted(set(new_times) - set(old_times)),
        "only_baseline": sorted(set(old_times) - set(new_times)),
    }


def comparison_status(result: dict | None) -> str:
    """ok, regressed, or inconclusive (every signature past the allowance is within the noise)."""
    if not result:
        return "ok"
    return "regressed" if result["regressed"] else "inconclusive" if result["inconclusive"] else "ok"


def say_comparison(result: dict, say) -> None:
    """`compare`'s result in lines, each given to `say` (`lzsolve compare`, `tune --baseline`)."""
    say(f"vs baseline {result['baseline']} (run {result['baseline_run']}), time new / old, "
        f"allowed +{result['threshold'] * 100:.0f}% over points of {result['min_ms'] * 1e3:g} µs or more:")
    for sig, c in result["signatures"].items():
        gate = (f"gated {c['gated_geomean']:.3f} over {c['gated_points']}" if c["gated_points"]
                else "under the floor: not gated")
        verdict = ("  REGRESSED" if c["regressed"] else f"  INCONCLUSIVE (timings spread {c['noise']:.0%}; "
                   f"{c['busy_points']} of {c['gated_points']} points timed on a busy machine)"
                   if c["inconclusive"] else "")
        say(f"  {sig}: geomean {c['ratio_geomean']:.3f}, worst {c['ratio_worst']:.3f} at {c['worst_at']} "
            f"({c['points']} points; {gate}){verdict}")
    for sig in result["only_new"]:
        say(f"  {sig}: new (no baseline)")
    for sig in result["only_baseline"]:
        say(f"  {sig}: only in the baseline")
    if result["inconclusive"]:
        say(f"inconclusive: the host was too busy to judge {len(result['inconclusive'])} signature(s): past the "
            "allowance by less than their timings spread, or timed while the machine was busy; tune again on an "
            "idle host (exit 5)")
