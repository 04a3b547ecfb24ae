#!/usr/bin/env bash
# Issue 18 on the lent H100: llama3-70b TP8 as an FP8 W8A8 deployment, tuned cold with the FP8
# linears' kernels alone (every other op keeps its fallback, so the call fits), triton.linear_fp8's
# tiles searched (TRIALS per bucket) on GRID (small: tokens 1-64; full: to 16384). Prints the
# table; with BENCH=1, then benchmarks/fp8.py with the table's kernels among the candidates
# (against bf16 cuBLAS in the same run).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
start=$(date +%s)
timeout -s INT "${TUNE_LIMIT:-480}" python3 -m lzsolve tune --model llama3-70b --tp 8 --dtype fp8 --device cuda \
  --grid "${GRID:-small}" --trials "${TRIALS:-6}" --kernels 'triton.linear_fp8*,triton.scaled_mm_fp8*,torch.scaled_mm_fp8' \
  --out .devrun/f 2> "$OUT/tune.err" | tee "$OUT/tune.out" | tail -12
echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; tail -3 "$OUT/tune.err"
cp .devrun/f/dispatch.json .devrun/f/report.md "$OUT/" 2>/dev/null
tar czf "$OUT/perfdb.tgz" -C .devrun/f perfdb
if [ "${BENCH:-0}" = 1 ]; then
  python3 benchmarks/fp8.py --no-decode --table .devrun/f --json "$OUT/fp8.json" > "$OUT/fp8.txt" 2> "$OUT/fp8.err" \
    || tail -8 "$OUT/fp8.err"
fi
