"""Where a tune on several devices waits: each device's records per phase, from its PerfDB.

A record's `ts` is when its measurement ended, so per phase and device the first and last `ts`
bound what that device did; the phase ends when its last device does, and the gap between a
device's last record and that end is the phase's tail on it (idle, but for the measurement in
flight). First calls (`jit_ms`) are what each process pays again. Issue 16, benchmark log §15.

    python benchmarks/lane_timeline.py OUT [--json timeline.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from lzsolve.store.perfdb import PerfDB

PHASES = ("compile", "grid", "probe", "validation")


def timeline(out: Path) -> list[dict]:
    db = PerfDB(out / "perfdb")
    start = db.rows("SELECT min(ts) AS t FROM records")[0]["t"]
    rows = db.rows(
        "SELECT phase, device_index AS device, count(*) AS records, min(ts) AS first, max(ts) AS last, "
        "coalesce(sum(jit_ms), 0) / 1e3 AS first_calls_s, count(*) FILTER (WHERE jit_ms > 500) AS slow_first_calls "
        "FROM records WHERE stage <> 'capability' GROUP BY ALL ORDER BY phase, device")
    ends = {}
    for r in rows:
        ends[r["phase"]] = max(ends.get(r["phase"], r["last"]), r["last"])
    return [{"phase": r["phase"], "device": r["device"], "records": r["records"],
             "from_s": round((r["first"] - start).total_seconds(), 1),
             "to_s": round((r["last"] - start).total_seconds(), 1),
             "tail_s": round((ends[r["phase"]] - r["last"]).total_seconds(), 1),
             "first_calls_s": round(r["first_calls_s"], 1), "slow_first_calls": r["slow_first_calls"]}
            for r in rows]


def slowest_first_calls(out: Path, n: int = 12) -> list[dict]:
    return PerfDB(out / "perfdb").rows(
        "SELECT phase, device_index AS device, kernel_id, signature, dims, round(jit_ms / 1e3, 2) AS first_call_s "
        f"FROM records WHERE jit_ms IS NOT NULL ORDER BY jit_ms DESC LIMIT {int(n)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a folder `lzsolve tune` wrote")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    rows = timeline(args.out)
    order = {p: n for n, p in enumerate(PHASES)}
    rows.sort(key=lambda r: (order.get(r["phase"], len(PHASES)), r["device"]))
    print(f"{'phase':<11}{'device':>7}{'records':>9}{'from s':>9}{'to s':>9}{'tail s':>8}{'first calls s':>15}{'> 0.5 s':>9}")
    for r in rows:
        print(f"{r['phase']:<11}{r['device']:>7}{r['records']:>9}{r['from_s']:>9}{r['to_s']:>9}{r['tail_s']:>8}"
              f"{r['first_calls_s']:>15}{r['slow_first_calls']:>9}")
    slow = slowest_first_calls(args.out)
    print("slowest first calls:")
    for r in slow:
        print(f"  {r['first_call_s']:>7} s  {r['phase']:<10} dev {r['device']}  {r['kernel_id']}  {r['dims']}")
    if args.json:
        args.json.write_text(json.dumps({"timeline": rows, "slowest_first_calls": slow}, indent=1, default=str))


if __name__ == "__main__":
    main()
