#!/usr/bin/env bash
# GPU parity of every adapter, in one device call: FlashInfer (JIT-compiles per kernel variant)
# in a second process beside the rest, so its compiles overlap the others' checks.
set -u
. benchmarks/device_setup.sh
run() { timeout 520 python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short "$@"; }
LZSOLVE_TEST_KERNELS='flashinfer.*' run tests/test_kernels.py > "$OUT/parity_flashinfer.log" 2>&1 &
LZSOLVE_TEST_EXCLUDE='flashinfer.*' run tests/ > "$OUT/parity_rest.log" 2>&1
wait
for log in "$OUT"/parity_*.log; do echo "== $log"; grep -vE "^ok " "$log" | tail -40; done
grep -hE "^ok " "$OUT"/parity_*.log | sort -k2 -n -r | head -12
