"""The figures of `lzsolve evaluate` recomputed from an artifact's PerfDB, without a GPU.

Evaluation runs stopped by a time limit (device calls of 10 minutes) and continued in later
calls leave their timings in several `eval-*` runs; this judges every evaluated shape against
the artifact's table with the same code `evaluate` uses (lzsolve.decide.validate.judge/summarize) and
prints one row per signature. benchmark log §10.4 came from it:

    python benchmarks/archive/eval_summary.py ARTIFACT [--since eval-20261123T125000Z]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from lzsolve.decide.validate import judge, summarize
from lzsolve.store.perfdb import PerfDB
from runtime_loader.table import choose, read_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--since", default="eval-", help="only eval runs whose id sorts at or after this")
    args = parser.parse_args()
    table = read_table(args.artifact / "dispatch.json")
    mode = table.raw["timing_mode"]
    trees = {str(sig): tree for sig, tree in table.trees.items()}
    rows = PerfDB(args.artifact / "perfdb").rows(
        "SELECT * FROM records WHERE run_id LIKE 'eval-%' AND run_id >= ?", [args.since])
    by_point: dict[tuple, list[dict]] = {}
    for r in rows:
        by_point.setdefault((r["run_id"], r["signature"], r["dims"]), []).append(r)
    results = []
    for (_, sig, dims), recs in by_point.items():
        if sig not in trees:
            continue
        fallback = next((r["kernel_id"] for r in recs if r["is_fallback"]), "")
        point = json.loads(dims)
        results.append(judge(sig, point, choose(trees[sig], point), fallback, recs, mode))
    summary = summarize(results)
    print(f"{'signature':60} timings  regret geomean  worst   vs default geomean  worst")
    for sig, s in {**summary["signatures"], "all": summary["overall"]}.items():
        print(f"{sig[:60]:60} {s['points']:7}  {s['regret_geomean']:.3f}           {s['regret_worst']:.3f}   "
              f"{s['vs_default_geomean']:.3f}               {s['vs_default_worst']:.3f}")
    for p in summary["points"]:
        if (p["regret"] or 1) > 1.05 or (p["vs_default"] or 1) > 1.02:
            print(f"  {p['signature'][:40]} {p['dims']}: chose {p['chosen']} {p['chosen_ms'] * 1e3:.1f} us, "
                  f"best {p['best']} {p['best_ms'] * 1e3:.1f} us, default {p['fallback_ms'] * 1e3:.1f} us")


if __name__ == "__main__":
    main()
