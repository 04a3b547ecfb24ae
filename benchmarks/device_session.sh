#!/usr/bin/env bash
# Everything measured on the lent GPU for BENCHMARKS.md, in one call: run from the repo root with $OUT set.
set -u
export PYTHONUNBUFFERED=1
lz() { python3 -c "from lzsolve.cli import main; main()" "$@"; }
echo "== gpu tests"; python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --tb=line 2>&1 | grep -E "Error|error|passed|failed" | tail -8
echo "== tune A, B"
for run in a b; do python3 benchmarks/tune_agreement.py run /tmp/runs/$run --model llama3-70b --tp 8 --device cuda 2>&1 | tail -1; done
for mode in graph eager; do python3 benchmarks/tune_agreement.py compare /tmp/runs/a /tmp/runs/b --mode $mode --json "$OUT/agreement_$mode.json"; done
echo "== evaluate"; lz evaluate /tmp/runs/a --json "$OUT/evaluate_h100.json" 2>&1 | tail -15
echo "== jit"; python3 benchmarks/jit_restore.py /tmp/runs/a --json "$OUT/jit_restore.json"
echo "== replay"; python3 benchmarks/replay_overhead.py --device cuda --json "$OUT/replay_overhead.json" | tail -7
echo "== harness"; python3 benchmarks/harness_agreement.py --json "$OUT/harness_agreement.json" | tail -16
cp /tmp/runs/a/report.md "$OUT/report_h100.md"
tar czf "$OUT/h100_artifact.tgz" -C /tmp/runs --exclude=.jit-work a; ls -la "$OUT"
