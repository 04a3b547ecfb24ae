#!/usr/bin/env bash
# Issue 18 on the lent H100: llama3-70b TP8 as an FP8 W8A8 deployment, tuned cold with the FP8
# kernels alone (the linears', and the norms' and SwiGLU's that quantise for the linear after them;
# every other op keeps its fallback, so the call fits), the Triton families searched (TRIALS per
# bucket) on GRID (small: tokens 1-64; full: to 16384). Prints the table's end and keeps its
# dispatch.json and report under $OUT. BENCH=1: then benchmarks/fp8.py --pairs with the table's
# kernels among the candidates (against bf16 in the same run). TABLE=dir (carried: its dispatch.json)
# skips the tune and benchmarks that table.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
table=${TABLE:-}
if [ -z "$table" ]; then
  start=$(date +%s) table=.devrun/f
  timeout -s INT "${TUNE_LIMIT:-480}" python3 -m lzsolve tune --model llama3-70b --tp 8 --dtype fp8 --device cuda \
    --grid "${GRID:-small}" --trials "${TRIALS:-6}" \
    --kernels 'triton.linear_fp8*,triton.scaled_mm_fp8*,torch.scaled_mm*,triton.rms_norm*fp8*,triton.swiglu_fp8*' \
    --out "$table" 2> "$OUT/tune.err" | tee "$OUT/tune.out" | tail -12
  echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; tail -3 "$OUT/tune.err"
  cp "$table"/dispatch.json "$table"/report.md "$OUT/" 2>/dev/null
  tar czf "$OUT/perfdb.tgz" -C "$table" perfdb
fi
if [ "${BENCH:-0}" = 1 ]; then
  python3 benchmarks/fp8.py --no-decode --pairs ${FP8_ARGS-} --table "$table" --json "$OUT/fp8.json" > "$OUT/fp8.txt" \
    2> "$OUT/fp8.err" || tail -8 "$OUT/fp8.err"
fi
