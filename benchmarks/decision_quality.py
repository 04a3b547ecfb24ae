"""Decision quality: the table's regret on shapes it never saw, against the best admitted
kernel and against PyTorch's default, from `lzsolve evaluate` (every admitted kernel and the
fallback timed interleaved at the geometric midpoints between grid buckets).

    python benchmarks/decision_quality.py ARTIFACT --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "evaluate.json"
        done = subprocess.run([sys.executable, "-m", "lzsolve", "evaluate", args.artifact, "--json", str(report)],
                              stdout=subprocess.DEVNULL)
        if not report.is_file():
            sys.exit(f"error: lzsolve evaluate exited {done.returncode} without a report")
        result = json.loads(report.read_text())
    table = json.loads((Path(args.artifact) / "dispatch.json").read_text())
    print(f"{'signature':56} {'shapes':>6} {'regret geo':>10} {'worst':>7} {'vs default geo':>14} {'worst':>7}")
    for sig, s in [*result["signatures"].items(), ("all", result["overall"])]:
        cells = [f"{s[k]:.3f}" if s[k] is not None else "-" for k in
                 ("regret_geomean", "regret_worst", "vs_default_geomean", "vs_default_worst")]
        print(f"{sig:56} {s['points']:6d} {cells[0]:>10} {cells[1]:>7} {cells[2]:>14} {cells[3]:>7}")
    print(f"regret = time(table choice) / time(best kernel at that shape); vs default = time(table choice) / "
          f"time(PyTorch default); {result['timing_mode']} timing, {table['hardware']['name']}; "
          f"evaluate exit {done.returncode}")
    if args.json:
        Path(args.json).write_text(json.dumps({"date": dt.date.today().isoformat(), "hardware": table["hardware"],
                                               "exit_code": done.returncode, **result}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
