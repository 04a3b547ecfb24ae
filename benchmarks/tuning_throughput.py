"""Tuning wall time and records per minute, cold (empty PerfDB) and warm (the same command again).

Runs `lzsolve tune --json` twice into one fresh folder: the first run measures everything,
the second finds every measurement in the PerfDB and only gates, solves and writes. Extra
options after `--` go to both tunes (e.g. -- --trials 0 --grid full).

    python benchmarks/tuning_throughput.py --model llama3-70b --tp 8 --out /tmp/tp --json out.json -- --trials 0
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def tune(args, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "lzsolve", "tune", "--model", args.model, "--tp", str(args.tp), "--out",
           str(args.out), "--json", *extra]
    started = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started  # process wall time: imports and worker start included
    if done.returncode not in (0, 3):
        sys.exit(f"error: {' '.join(cmd[2:])} exited {done.returncode}")
    summary = json.loads(done.stdout)
    return {"process_wall_s": wall, "tune_wall_s": summary["wall_s"], "records": summary["records"],
            "measured": summary["measured"], "reused": summary["reused"], "signatures": len(summary["signatures"]),
            "hardware": summary["hardware"], "grid": summary["grid"]}


def main() -> None:
    argv = sys.argv[1:]
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-70b")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True, help="a folder to tune into (emptied first)")
    parser.add_argument("--json")
    args = parser.parse_args(ours)
    shutil.rmtree(args.out, ignore_errors=True)
    runs = {"cold": tune(args, extra), "warm": tune(args, extra)}
    print(f"{'run':5} {'wall s':>8} {'records':>8} {'measured':>9} {'reused':>7} {'records/min':>12} {'measured/min':>13}")
    for name, r in runs.items():
        r["records_per_min"] = r["records"] / r["process_wall_s"] * 60
        r["measured_per_min"] = r["measured"] / r["process_wall_s"] * 60
        print(f"{name:5} {r['process_wall_s']:8.1f} {r['records']:8d} {r['measured']:9d} {r['reused']:7d} "
              f"{r['records_per_min']:12.0f} {r['measured_per_min']:13.0f}")
    print(f"warm / cold wall: {runs['warm']['process_wall_s'] / runs['cold']['process_wall_s']:.3f} "
          f"({args.model} tp={args.tp}, grid {runs['cold']['grid']}, {runs['cold']['hardware']}, tune options {extra})")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": dt.date.today().isoformat(), "model": args.model,
                                               "tp": args.tp, "options": extra, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
