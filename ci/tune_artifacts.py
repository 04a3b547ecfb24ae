#!/usr/bin/env python3
"""The CI step: tune models, evaluate the artifacts, gate on regressions against the previous ones.

    python ci/tune_artifacts.py --out ci-artifacts [--baseline previous/] llama3-70b:8 qwen3-8b [-- TUNE OPTIONS]

For each MODEL[:TP] (a built-in name or a config.json path) it runs
`lzsolve tune --json` into OUT/<model>-tp<TP>/ (with `--baseline` when BASELINE holds
an artifact of the same name: a previous run's OUT, downloaded) and then
`lzsolve evaluate` on it. Every step's JSON lands in OUT/ beside the artifacts, with
OUT/summary.json and OUT/summary.md (also appended to $GITHUB_STEP_SUMMARY when set).
A model that fails does not stop the others.

Exit code: 1 if any model failed (tune or evaluate), else 3 if any regressed, else 5 if any
comparison was inconclusive (past --max-regression, but within the noise: by less than its timings'
spread, or timed on a busy machine; the host was too busy to judge: tune again on an idle runner),
else 0.
Runs the same on a laptop CPU and on a GPU runner; OUT is what the workflow uploads.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OK, FAILED, REGRESSED, INCONCLUSIVE = 0, 1, 3, 5  # lzsolve's exit codes (lzsolve/cli.py)
EXIT = {"ok": OK, "failed": FAILED, "regressed": REGRESSED, "inconclusive": INCONCLUSIVE}
WORST_FIRST = ("failed", "regressed", "inconclusive", "ok")
LZSOLVE = [sys.executable, "-m", "lzsolve"]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, tune_extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="options after -- go to every `lzsolve tune` (e.g. -- --grid small)")
    parser.add_argument("models", nargs="+", metavar="MODEL[:TP]", help="built-in model name or config.json path")
    parser.add_argument("--out", type=Path, required=True, help="folder for the artifacts and summaries")
    parser.add_argument("--baseline", type=Path, help="a previous run's --out folder to compare with")
    parser.add_argument("--max-regression", type=float, default=0.10,
                        help="allowed slowdown per op signature vs the baseline (default 0.10 = 10%%)")
    parser.add_argument("--no-evaluate", action="store_true", help="skip `lzsolve evaluate` (off-grid regret)")
    return parser.parse_args(ours), tune_extra


def model_entry(arg: str) -> tuple[list[str], str]:
    """('--model', name) or ('--config', path) options with --tp, and the artifact's folder name."""
    target, _, tp = arg.rpartition(":") if ":" in arg else (arg, "", "1")
    if not tp.isdigit() or int(tp) < 1:
        raise ValueError(f"{arg!r}: expected MODEL[:TP] with TP a positive integer")
    is_config = target.endswith(".json") or os.sep in target
    name = Path(target).parent.name if is_config else target
    return ["--config" if is_config else "--model", target, "--tp", tp], f"{name}-tp{tp}"


def run(cmd: list[str], stdout_to: Path | None = None) -> tuple[int, str]:
    """Run a step with its stderr streaming into the CI log; returns (exit code, stdout)."""
    print("$ " + " ".join(cmd[2:] if cmd[:2] == LZSOLVE[:2] else cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if stdout_to is not None and done.stdout.strip():
        stdout_to.write_text(done.stdout)
    return done.returncode, done.stdout


def tune_one(arg: str, args: argparse.Namespace, tune_extra: list[str]) -> dict:
    started = time.monotonic()
    try:
        model_opts, name = model_entry(arg)
    except ValueError as e:
        return {"model": arg, "status": "failed", "error": str(e)}
    artifact = args.out / name
    baseline = args.baseline / name if args.baseline else None
    cmd = [*LZSOLVE, "tune", *model_opts, "--out", str(artifact), "--json", *tune_extra]
    if baseline is not None and (baseline / "dispatch.json").is_file():
        cmd += ["--baseline", str(baseline), "--max-regression", str(args.max_regression)]
    else:
        baseline = None
    code, stdout = run(cmd, args.out / f"{name}.tune.json")
    result = {"model": arg, "artifact": str(artifact), "tune_exit": code, "baseline": str(baseline) if baseline else None}
    try:
        result["tune"] = json.loads(stdout)
    except json.JSONDecodeError:
        result["tune"] = None
    if code not in (OK, REGRESSED, INCONCLUSIVE) or result["tune"] is None:
        return {**result, "status": "failed", "error": f"lzsolve tune exited {code}",
                "wall_s": round(time.monotonic() - started, 1)}
    if not args.no_evaluate:
        report = args.out / f"{name}.evaluate.json"
        result["evaluate_exit"], _ = run([*LZSOLVE, "evaluate", str(artifact), "--json", str(report)])
        result["evaluate"] = json.loads(report.read_text())["overall"] if report.is_file() else None
        if result["evaluate_exit"] != OK:
            return {**result, "status": "failed", "error": f"lzsolve evaluate exited {result['evaluate_exit']}",
                    "wall_s": round(time.monotonic() - started, 1)}
    status = {REGRESSED: "regressed", INCONCLUSIVE: "inconclusive"}.get(code, "ok")
    return {**result, "status": status, "wall_s": round(time.monotonic() - started, 1)}


def fmt(value, spec=".3f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: list[dict]) -> str:
    lines = ["## lzsolve artifacts", "",
             "| model | status | signatures | regret geomean (off-grid) | vs default | vs baseline | wall s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        tune, ev = r.get("tune") or {}, r.get("evaluate") or {}
        comparison = tune.get("comparison") or {}
        vs_base = fmt((comparison.get("overall") or {}).get("ratio_geomean"))
        if comparison.get("regressed"):
            vs_base += " (regressed: " + ", ".join(comparison["regressed"]) + ")"
        if comparison.get("inconclusive"):
            vs_base += " (inconclusive, the host too busy to judge: " + ", ".join(comparison["inconclusive"]) + ")"
        lines.append(f"| {r['model']} | {r['status']}{': ' + r['error'] if r.get('error') else ''} | "
                     f"{len(tune.get('signatures', []))} | {fmt(ev.get('regret_geomean'))} | "
                     f"{fmt(ev.get('vs_default_geomean'))} | {vs_base} | {r.get('wall_s', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args, tune_extra = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [tune_one(arg, args, tune_extra) for arg in args.models]
    statuses = {r["status"] for r in results}
    overall = next(status for status in WORST_FIRST if status in statuses | {"ok"})
    (args.out / "summary.json").write_text(json.dumps({"status": overall, "models": results}, indent=1) + "\n")
    md = markdown(results)
    (args.out / "summary.md").write_text(md)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(md)
    print(md, file=sys.stderr)
    return EXIT[overall]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
