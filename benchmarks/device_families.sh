#!/usr/bin/env bash
# The small member of each model family, tuned on the GPU (tiny grid: this shows the pipeline works
# for every family there; the timing figures of record are the llama3-70b runs). Usage:
#   MODELS="gpt2 qwen3-0.6b" PARITY=1 bash benchmarks/device_families.sh
set -u
. benchmarks/device_setup.sh > /dev/null
if [ "${PARITY:-0}" = 1 ]; then  # the adapters' new feature combinations (window, softcap, unit_offset, new ops)
  LZSOLVE_TEST_EXCLUDE='flashinfer.*' timeout 300 python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short \
    tests/test_kernels.py > "$OUT/parity.log" 2>&1
  grep -vE "^ok " "$OUT/parity.log" | tail -15
fi
for model in ${MODELS:-gpt2 qwen2-0.5b qwen3-0.6b qwen3.5-0.8b gemma3-270m}; do
  start=$(date +%s)
  timeout -s INT "${LIMIT:-240}" python3 -c "from lzsolve.cli import main; main()" tune --model "$model" \
    --device cuda --grid tiny --trials 2 ${EXTRA:-} --out "/tmp/runs/$model" > "$OUT/$model.out" 2> "$OUT/$model.err"
  echo "== $model rc=$? $(( $(date +%s) - start ))s"; grep "^note" "$OUT/$model.err" | cut -c1-200; tail -n +2 "$OUT/$model.out"
done
