#!/usr/bin/env bash
# BENCHMARKS.md §13 on the lent H100 (issue 20: Qwen3.5's Gated DeltaNet layers), in one device call:
# the GPU parity tests of the new kernels, then what the patched layer calls at the benchmark's
# shapes recorded and tuned (eager mode, as the layer is served), then the benchmark itself.
# PARITY_KERNELS narrows the parity tests, PROFILE=1 adds the benchmark's profiles ($OUT/prof).
# Everything it writes is under $OUT: parity.txt, tune.err, report.md, q35.tgz (the table: carry it back as
# .devrun/parts/q35.tgz and the next call benchmarks it without tuning again), bench.txt, qwen35.json.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
grep -E "^torch|fla\.|triton\.sigmoid" "$OUT/setup.txt"
python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)"
start=$(date +%s)
# tests/test_kernels.py's GPU parity checks, for the new kernels only (FLA's chunk sizes at the corners of its space)
LZSOLVE_TEST_KERNELS="${PARITY_KERNELS:-fla.*,*sigmoid_gate,*causal_conv1d,*deltanet*}" timeout "${PARITY_LIMIT:-240}" \
  python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short tests/test_kernels.py \
  -k "cuda_kernel_parity or searched_configs" > "$OUT/parity.txt" 2>&1
echo "parity rc=$? after $(( $(date +%s) - start )) s"; grep -vE "^ok " "$OUT/parity.txt" | tail -12
python3 benchmarks/qwen35_linear_attention.py --record /tmp/w.json 2> "$OUT/record.err" || tail -5 "$OUT/record.err"
if [ -f .devrun/parts/q35.tgz ]; then  # the table of an earlier call (its $OUT/q35.tgz, carried back)
  tar xzf .devrun/parts/q35.tgz -C /tmp && echo "table from .devrun/parts/q35.tgz"
else
  timeout "${TUNE_LIMIT:-240}" python3 -m lzsolve tune --workload /tmp/w.json --mode eager --no-probe --validate 0 \
    --trials "${TRIALS:-0}" --kernels "${KERNELS:-*}" --exclude 'compile.*,triton.linear' --out /tmp/art > /dev/null 2> "$OUT/tune.err"
  echo "tune rc=$? after $(( $(date +%s) - start )) s"; grep -E "error|wrote|in [0-9]+ s" "$OUT/tune.err" | tail -4
  tar cz -C /tmp --exclude=.jit-work art > "$OUT/q35.tgz"
fi
cp /tmp/art/report.md "$OUT/" 2> /dev/null
python3 benchmarks/qwen35_linear_attention.py --artifact /tmp/art --json "$OUT/qwen35.json" ${PROFILE:+--profile "$OUT/prof"} 2> "$OUT/bench.err" \
  | tee "$OUT/bench.txt"  # each scenario's line as it is measured: a call cut by its limit keeps them
[ "${PIPESTATUS[0]}" = 0 ] || tail -8 "$OUT/bench.err"
echo "done after $(( $(date +%s) - start )) s"
