#!/usr/bin/env bash
# BENCHMARKS §11.7 (issue 14) on a GPU (device tool, carry .devsite): our Triton kernels through the
# launcher (runtime_loader/kernels/triton_ops/launch.py). First its checks: the launcher's key against
# Triton's own binder, and every Triton kernel's parity with the fp32 reference (tests/test_kernels.py
# checks each case twice with fresh inputs: the second call of a key is the launcher's direct launch;
# TESTS= other tests, e.g. all of tests/test_kernels.py for the search spaces' corners too); then
# benchmarks/launch_overhead.py, ROUNDS times. KERNELS= other kernel globs for the parity run (default triton.*).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
LZSOLVE_TEST_KERNELS="${KERNELS:-triton.*}" timeout "${PARITY_S:-400}" python3 -m pytest -q -m gpu -s -p no:cacheprovider \
  --tb=short ${TESTS:-tests/test_triton_launch.py tests/test_kernels.py::test_cuda_kernel_parity} \
  > "$OUT/parity_triton.log" 2>&1
echo "parity rc $?"; grep -vE "^ok " "$OUT/parity_triton.log" | tail -15
for round in $(seq "${ROUNDS:-2}"); do
  python3 benchmarks/launch_overhead.py --json "$OUT/launch-$round.json" | tee "$OUT/launch-$round.txt"
done
