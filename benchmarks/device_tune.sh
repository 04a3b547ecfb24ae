#!/usr/bin/env bash
# One device call of the llama3-70b TP8 tuning run behind BENCHMARKS.md's kernel-family tables.
# The run continues what .devrun/a holds (PerfDB and optuna studies carried back from an earlier
# call that ran out of time), so a tune longer than one call finishes over several.
set -u
. benchmarks/device_setup.sh > /dev/null
mkdir -p .devrun/a
start=$(date +%s)
timeout -s INT "${TUNE_LIMIT:-540}" python3 -c "from lzsolve.cli import main; main()" tune --model llama3-70b --tp 8 \
  --device cuda --trials "${TRIALS:-6}" --out .devrun/a 2> "$OUT/tune.err" | tee "$OUT/tune.out"
echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; tail -3 "$OUT/tune.err"
tar czf "$OUT/devrun.tgz" --exclude=.jit-work .devrun
[ -f .devrun/a/dispatch.json ] && python3 benchmarks/kernel_families.py .devrun/a --json "$OUT/kernel_families.json"
