"""Do two independent tuning runs choose the same kernels?

    python benchmarks/tune_agreement.py run DIR/a --model llama3-70b --tp 8   # a fresh `lzsolve tune`, timed
    python benchmarks/tune_agreement.py run DIR/b --model llama3-70b --tp 8
    python benchmarks/tune_agreement.py compare DIR/a DIR/b [--mode graph] [--json out.json]

`compare` reads both PerfDBs; per op signature and grid bucket it takes each
run's fastest admitted kernel; among the buckets whose winning margin in the
first run (runner-up time / winner time - 1) is above 5%, it prints the share
on which the second run picked the same winner. Then the dispatch tables
themselves: at every grid and probe point both runs measured, the kernel each
table dispatches, and where they differ, what the other table's choice costs in
each run's own timings (its time / the own choice's time).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from lzsolve.decide.solve import pick
from lzsolve.store.perfdb import PerfDB

MARGIN = 0.05
# the records of the latest tune in a PerfDB: `lzsolve evaluate` adds runs of its own after it
LATEST_TUNE = "run_id = (SELECT run_id FROM records WHERE phase = 'grid' ORDER BY ts DESC LIMIT 1)"


def winners(artifact: Path, mode: str) -> dict[tuple[str, str], tuple[str, float | None]]:
    rows = PerfDB(artifact / "perfdb").rows(
        f"SELECT signature, dims, kernel_id, {mode}_ms AS ms FROM admitted WHERE {mode}_ms IS NOT NULL "
        f"AND {LATEST_TUNE}")
    by_bucket: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for r in rows:
        by_bucket.setdefault((r["signature"], r["dims"]), []).append((r["ms"], r["kernel_id"]))
    out = {}
    for key, times in by_bucket.items():
        times.sort()
        margin = times[1][0] / times[0][0] - 1 if len(times) > 1 else None
        out[key] = (times[0][1], margin)
    return out


def point_times(artifact: Path, mode: str) -> dict[tuple[str, str], dict[str, float]]:
    """(signature, dims) -> {kernel id: ms} over the grid and probe points of the latest tune."""
    rows = PerfDB(artifact / "perfdb").rows(
        f"SELECT signature, dims, kernel_id, {mode}_ms AS ms FROM admitted WHERE {mode}_ms IS NOT NULL "
        f"AND phase IN ('grid', 'probe') AND {LATEST_TUNE}")
    times: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        times.setdefault((r["signature"], r["dims"]), {})[r["kernel_id"]] = r["ms"]
    return times


def table_choices(a: Path, b: Path, mode: str) -> dict:
    """Where both tables are defined and both runs measured: how often they dispatch the same
    kernel, and at each point where they differ, the cost of the other's choice in each run."""
    trees = [{o["signature"]: o["tree"] for o in json.loads((p / "dispatch.json").read_text())["ops"]} for p in (a, b)]
    ta, tb = point_times(a, mode), point_times(b, mode)
    same, differ = 0, []
    for sig, dims in sorted(set(ta) & set(tb)):
        if sig not in trees[0] or sig not in trees[1]:
            continue
        ka, kb = (pick(t[sig], json.loads(dims)) for t in trees)
        if ka == kb:
            same += 1
            continue
        cost_a = ta[sig, dims][kb] / ta[sig, dims][ka] if {ka, kb} <= set(ta[sig, dims]) else None
        cost_b = tb[sig, dims][ka] / tb[sig, dims][kb] if {ka, kb} <= set(tb[sig, dims]) else None
        differ.append({"signature": sig, "dims": dims, "a": ka, "b": kb, "cost_in_a": cost_a, "cost_in_b": cost_b})
    return {"points": same + len(differ), "same": same, "differ": differ}


def run(out: Path, extra: list[str]) -> None:
    started = time.perf_counter()
    cmd = [sys.executable, "-c", "from lzsolve.cli import main; main()", "tune", "--fresh", "--out", str(out), *extra]
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - started
    n = PerfDB(out / "perfdb").rows("SELECT count(*) AS n FROM records")[0]["n"]
    (out / "wall.json").write_text(json.dumps({"wall_s": wall, "records": n, "command": cmd[3:]}))
    print(f"{out}: {wall:.0f} s wall, {n} records")


def compare(a: Path, b: Path, mode: str, json_out: str | None) -> None:
    wa, wb = winners(a, mode), winners(b, mode)
    common = sorted(set(wa) & set(wb))
    decisive = [k for k in common if wa[k][1] is not None and wa[k][1] > MARGIN]
    agree = [k for k in decisive if wa[k][0] == wb[k][0]]
    all_agree = [k for k in common if wa[k][0] == wb[k][0]]
    share = len(agree) / len(decisive) if decisive else float("nan")
    print(f"buckets: {len(common)}; winner margin > {MARGIN:.0%} in run A: {len(decisive)}; "
          f"same winner in run B: {len(agree)} ({share:.1%}); all buckets: {len(all_agree)}/{len(common)}")
    for k in decisive:
        if wa[k][0] != wb[k][0]:
            print(f"  differs: {k[0]} {k[1]}: {wa[k][0]} (+{wa[k][1]:.1%}) vs {wb[k][0]}")
    tables = table_choices(a, b, mode)
    n, costs = tables["points"], [c for d in tables["differ"] for c in (d["cost_in_a"], d["cost_in_b"]) if c]
    print(f"tables: {n} points; same kernel dispatched at {tables['same']} ({tables['same'] / n:.1%})" if n else
          "tables: no point measured by both runs")
    if costs:
        costs.sort()
        print(f"  where they differ ({len(tables['differ'])} points), the other table's choice costs "
              f"{costs[len(costs) // 2]:.3f}x the own (median), {costs[-1]:.3f}x at worst, in each run's timings")
    if json_out:
        walls = {name: json.loads((p / "wall.json").read_text()) for name, p in (("a", a), ("b", b))
                 if (p / "wall.json").exists()}
        Path(json_out).write_text(json.dumps({"mode": mode, "buckets": len(common), "decisive": len(decisive),
                                              "agree": len(agree), "share": share, "runs": walls,
                                              "tables": tables}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("out", type=Path)
    p_cmp = sub.add_parser("compare")
    p_cmp.add_argument("a", type=Path)
    p_cmp.add_argument("b", type=Path)
    p_cmp.add_argument("--mode", default="graph", choices=["graph", "eager"])
    p_cmp.add_argument("--json")
    args, extra = parser.parse_known_args()
    if args.cmd == "run":
        run(args.out, extra)
    else:
        compare(args.a, args.b, args.mode, args.json)


if __name__ == "__main__":
    main()
