#!/usr/bin/env bash
# BENCHMARKS.md §13 on the lent H100 (issue 20: Qwen3.5's Gated DeltaNet layers), in one device call:
# the GPU parity tests of the new kernels, then what the patched layer calls at the benchmark's
# shapes recorded and tuned (eager mode, as the layer is served), then the benchmark itself.
# Everything it writes is under $OUT: parity.txt, tune.err, report.md, qwen35.json.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
grep -E "^torch|fla\.|triton\.sigmoid" "$OUT/setup.txt"
python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)"
start=$(date +%s)
# tests/test_kernels.py's GPU parity check, for the new kernels only (and FLA's other chunk sizes)
timeout "${PARITY_LIMIT:-240}" python3 - > "$OUT/parity.txt" 2>&1 <<'PY'
import os
from tests.test_kernels import cases, check
new = ("fla.", "triton.sigmoid_gate", "compile.sigmoid_gate", "compile.causal_conv1d", "eager.causal_conv1d",
       "eager.gated_deltanet")
failures = passed = 0
for kernel_id, sig, dims in cases("cuda"):
    if not kernel_id.startswith(new) or (os.environ.get("BF16_ONLY") and sig.dtype != "bf16"):
        continue
    ids = [kernel_id] + ([f"fla.chunk_gated_deltanet[chunk={c}]" for c in (16, 32)]
                         if kernel_id == "fla.chunk_gated_deltanet" else [])
    for kid in ids:
        try:
            check(kid, sig, dims, "cuda")
            passed += 1
            print("ok", kid, sig, dims, flush=True)
        except Exception as e:  # noqa: BLE001
            failures += 1
            print("FAIL", kid, sig, dims, type(e).__name__, str(e)[:300], flush=True)
print(f"{passed} agree, {failures} fail")
PY
echo "parity rc=$? after $(( $(date +%s) - start )) s"; grep -E "FAIL|agree" "$OUT/parity.txt" | head -12
python3 benchmarks/qwen35_linear_attention.py --record /tmp/w.json 2> "$OUT/record.err" || tail -5 "$OUT/record.err"
timeout "${TUNE_LIMIT:-240}" python3 -m lzsolve tune --workload /tmp/w.json --mode eager --no-probe --validate 0 \
  --trials "${TRIALS:-0}" --kernels "${KERNELS:-*}" --exclude 'compile.*,triton.linear' --out /tmp/art > /dev/null 2> "$OUT/tune.err"
echo "tune rc=$? after $(( $(date +%s) - start )) s"; grep -E "error|wrote|in [0-9]+ s" "$OUT/tune.err" | tail -4
cp /tmp/art/report.md "$OUT/" 2> /dev/null
python3 benchmarks/qwen35_linear_attention.py --artifact /tmp/art --json "$OUT/qwen35.json" 2> "$OUT/bench.err" \
  || tail -8 "$OUT/bench.err"
echo "done after $(( $(date +%s) - start )) s"
