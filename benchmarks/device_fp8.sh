#!/usr/bin/env bash
# BENCHMARKS.md on the lent H100 (issue 18: FP8 linears and the FP8 KV cache), in one device call:
# the GPU parity check of the FP8 kernels (tests/test_kernels.py's check), then benchmarks/fp8.py.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
grep -E "^torch|flashinfer.decode" "$OUT/setup.txt"
timeout "${PARITY_LIMIT:-150}" python3 - > "$OUT/parity.txt" 2>&1 <<'PY'
from tests.test_kernels import cases, check
failures = passed = 0
for kernel_id, sig, dims in cases("cuda"):
    if sig.op not in ("linear.fp8", "attention.decode_fp8kv"):
        continue
    try:
        check(kernel_id, sig, dims, "cuda")
        passed += 1
        print("ok", kernel_id, sig, dims, flush=True)
    except Exception as e:  # noqa: BLE001
        failures += 1
        print("FAIL", kernel_id, sig, dims, type(e).__name__, str(e)[:300], flush=True)
print(f"{passed} agree, {failures} fail")
PY
echo "parity rc=$?"; grep -E "FAIL|agree" "$OUT/parity.txt" | head -12
python3 benchmarks/fp8.py --json "$OUT/fp8.json" 2> "$OUT/fp8.err" || tail -8 "$OUT/fp8.err"
