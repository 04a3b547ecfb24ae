#!/usr/bin/env bash
# Everything measured on the lent GPU for BENCHMARKS.md, in one call: run from the repo root with $OUT set.
set -u
export PYTHONUNBUFFERED=1
lz() { python3 -c "from lzsolve.cli import main; main()" "$@"; }
echo "== gpu tests"; python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --tb=line 2>&1 | grep -E "Error|error|passed|failed" | tail -8
echo "== harness"; python3 benchmarks/harness_agreement.py --json "$OUT/harness_agreement.json" | tail -17
echo "== replay"; python3 benchmarks/replay_overhead.py --device cuda --json "$OUT/replay_overhead.json" | tail -7
echo "== tune"; python3 benchmarks/tune_agreement.py run /tmp/h100 --model llama3-70b --tp 8 --device cuda 2>&1 | tail -12
echo "== evaluate"; lz evaluate /tmp/h100 --json "$OUT/evaluate_h100.json" 2>&1 | tail -16
echo "== jit"; python3 benchmarks/jit_restore.py /tmp/h100 --json "$OUT/jit_restore.json"
tar czf "$OUT/h100_artifact.tgz" -C /tmp --exclude=.jit-work h100; ls -la "$OUT"
