#!/usr/bin/env bash
# BENCHMARKS.md on the lent H100 (issue 18: FP8 linears and the FP8 KV cache), in one device call:
# the GPU parity tests of the FP8 kernels and their search spaces' corners (tests/test_kernels.py), then
# benchmarks/fp8.py (FP8_ARGS=--no-decode: the linears alone; --pairs: q/k/v and gate/up with the norm
# before them, the quantisation in the linear or in the norm).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
grep -E "^torch|flashinfer.decode" "$OUT/setup.txt"
LZSOLVE_TEST_KERNELS='*fp8*,torch.scaled_mm' timeout "${PARITY_LIMIT:-150}" python3 -m pytest -q -m gpu -s -p no:cacheprovider \
  --tb=short tests/test_kernels.py -k "cuda_kernel_parity or searched_configs" > "$OUT/parity.txt" 2>&1
echo "parity rc=$?"; grep -vE "^ok " "$OUT/parity.txt" | tail -12
python3 benchmarks/fp8.py --json "$OUT/fp8.json" ${FP8_ARGS-} 2> "$OUT/fp8.err" || tail -8 "$OUT/fp8.err"
