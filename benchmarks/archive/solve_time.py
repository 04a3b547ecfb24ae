"""How long `tune` spends solving the table from a PerfDB's records: solve_signature per
signature, as build_table calls it (benchmark log §15.5: is the time after validation the solve?).

    python benchmarks/archive/solve_time.py OUT/perfdb [--mode graph] [--json trees.json]

--json writes every signature's solve (tree and figures): two checkouts' files, compared byte for
byte, say whether a change of the solver changed any table (benchmark log §15.11).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lzsolve.decide.solve import solve_signature
from lzsolve.store.artifact import by_signature
from lzsolve.store.perfdb import PerfDB
from runtime_loader.ops import OPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("perfdb")
    parser.add_argument("--mode", default="graph", choices=("graph", "eager"))
    parser.add_argument("--json", type=Path, help="write each signature's solve here")
    args = parser.parse_args()
    solved = {}
    records = PerfDB(args.perfdb).rows("SELECT * FROM records")
    total = 0.0
    for sig, recs in sorted(by_signature(records).items(), key=lambda kv: -len(kv[1])):
        op = OPS[recs[0]["op"]]
        started = time.perf_counter()
        solved[sig] = solve_signature(recs, op.dynamic, op.fallback, args.mode)
        spent = time.perf_counter() - started
        total += spent
        print(f"{spent:7.2f} s  {len(recs):5d} records  {sig}")
    print(f"{total:.1f} s for {len(records)} records")
    if args.json:
        args.json.write_text(json.dumps(solved, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
