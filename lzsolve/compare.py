"""Compare an artifact with a previous one: did the serving stack get slower?

For every op signature both tables serve, and every grid point both measured, the
ratio time(new table's choice) / time(old table's choice), each time taken from its
own artifact's PerfDB (the records its table was solved from). A signature regressed
when the geometric mean of its ratios exceeds 1 + threshold; single points are
reported but do not fail the gate, because one point's noise is larger than a
signature's. Points where both times are under `min_ms` are reported and not gated:
between two H100 runs of one stack, kernels of 2-3 µs moved by up to 23%.
Runs on different GPU models, dtypes or timing modes are not comparable.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from runtime_loader.table import TableError, choose, read_table

from .errors import LzError
from .validate import geomean
from .perfdb import PerfDB

# Three pairs of H100 tunes of one stack on the tiny grid (BENCHMARKS.md §9.5): norms, SwiGLU and
# RoPE (1.6-3.1 µs kernels at tokens <= 16) moved by up to 21% in a signature's geomean, the
# embedding (a 7 µs gather) by 61% once; linears (19 µs and more) by at most 3.2%.
DEFAULT_THRESHOLD = 0.10
DEFAULT_MIN_MS = 0.010


def chosen_times(folder: Path) -> tuple[dict, dict[str, dict[str, tuple[str, float]]]]:
    """(the table, signature -> dims key -> (chosen kernel, its time in ms)) at every grid
    point the table's run measured. Records are those the table could have been solved
    from: same hardware, written before it, not from `lzsolve evaluate`; the latest wins,
    as when `tune` reuses records."""
    try:
        table = read_table(folder / "dispatch.json")
    except TableError as e:
        raise LzError(f"cannot compare {folder}: {e}") from None
    raw = table.raw
    mode = raw["timing_mode"]
    created = dt.datetime.fromisoformat(raw["created_at"]).astimezone(dt.timezone.utc).replace(tzinfo=None)
    rows = PerfDB(folder / "perfdb").rows(
        f"SELECT signature, kernel_id, dims, {mode}_ms AS ms FROM admitted WHERE hw_slug = ? AND ts <= ? "
        f"AND run_id NOT LIKE 'eval-%' AND {mode}_ms IS NOT NULL ORDER BY ts",
        [raw["hw_slug"], created + dt.timedelta(seconds=1)])  # created_at is truncated to seconds
    latest = {(r["signature"], r["kernel_id"], r["dims"]): r["ms"] for r in rows}
    trees = {str(sig): tree for sig, tree in table.trees.items()}
    times: dict[str, dict[str, tuple[str, float]]] = {}
    for (signature, kernel_id, dims), ms in latest.items():
        if signature in trees and kernel_id == choose(trees[signature], json.loads(dims)):
            times.setdefault(signature, {})[dims] = (kernel_id, ms)
    return raw, times


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
    geomean over the gated ones (either time at least min_ms), and whether it regressed."""
    new, new_times = chosen_times(Path(new_folder))
    old, old_times = chosen_times(Path(old_folder))
    _comparable(new, old)
    signatures, all_ratios = {}, []
    for sig in sorted(set(new_times) & set(old_times)):
        common = sorted(set(new_times[sig]) & set(old_times[sig]))
        ratios = {d: new_times[sig][d][1] / old_times[sig][d][1] for d in common}
        if not ratios:
            continue
        gated = [r for d, r in ratios.items() if max(new_times[sig][d][1], old_times[sig][d][1]) >= min_ms]
        worst = max(ratios, key=ratios.get)
        signatures[sig] = {
            "points": len(ratios), "ratio_geomean": geomean(list(ratios.values())), "ratio_worst": ratios[worst],
            "worst_at": json.loads(worst), "gated_points": len(gated), "gated_geomean": geomean(gated),
            "kernels_new": sorted({new_times[sig][d][0] for d in common}),
            "kernels_old": sorted({old_times[sig][d][0] for d in common}),
            "regressed": bool(gated) and geomean(gated) > 1 + threshold,
        }
        all_ratios += ratios.values()
    return {
        "baseline": str(old_folder), "baseline_run": old["run_id"], "threshold": threshold, "min_ms": min_ms,
        "timing_mode": new["timing_mode"],
        "overall": {"points": len(all_ratios), "ratio_geomean": geomean(all_ratios)},
        "signatures": signatures,
        "regressed": sorted(s for s, v in signatures.items() if v["regressed"]),
        "only_new": sorted(set(new_times) - set(old_times)),
        "only_baseline": sorted(set(old_times) - set(new_times)),
    }
