#!/usr/bin/env bash
# On a GPU (device tool, carry .devsite): the mixture-of-experts kernels' parity (every contract
# case, the search spaces' corners, the sort's rows), then benchmarks/moe_layer.py. TUNE=1 first tunes a table
# for the benchmark's workload (TUNE_ARGS, default --trials 8) and packs it as $OUT/moe-art.tgz;
# ARTIFACT=dir|.tgz (carried) reuses one. TOKENS= limits the token counts (comma list); PARITY=0 skips
# the parity run; MODELS= the benchmark's models to tune and time (comma list); MOE_ARGS= more arguments
# for moe_layer.py (e.g. --max-loop-tokens 256).
set -u
. benchmarks/device_setup.sh
if [ "${PARITY:-1}" = 1 ]; then
  LZSOLVE_TEST_KERNELS='*moe*' timeout 240 python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short \
    tests/test_kernels.py > "$OUT/parity_moe.log" 2>&1
  echo "parity rc $?"; grep -vE "^ok " "$OUT/parity_moe.log" | tail -15
  # the sort's own check with real atomics (the module sets TRITON_INTERPRET: unset before the kernels load)
  python3 -c "import os, torch, tests.triton_interpret_check as t; os.environ.pop('TRITON_INTERPRET')
print('sort:', t.moe_rows_are_aligned(torch.device('cuda')) or 'aligned')"
fi
art=${ARTIFACT:-}  # a .tgz is unpacked where TUNE=1 tunes: a tune cut short goes on from its records
if [[ "$art" == *.tgz ]]; then mkdir -p /tmp/moe-art && tar -C /tmp/moe-art -xzf "$art" && art=/tmp/moe-art; fi
if [ "${TUNE:-0}" = 1 ]; then
  python3 benchmarks/moe_layer.py --write-workload /tmp/moe-wl.json ${MODELS:+--models $MODELS}
  start=$(date +%s)
  timeout "${TUNE_S:-400}" python3 -m lzsolve tune --workload /tmp/moe-wl.json ${TUNE_ARGS:---trials 8} \
    --out /tmp/moe-art > "$OUT/tune.log" 2>&1
  echo "tune rc $? $(( $(date +%s) - start )) s"; tail -5 "$OUT/tune.log"
  # without its JIT caches (tens of MB, rebuilt by a tune that goes on from it): small enough to come back
  art=/tmp/moe-art && tar -C "$art" --exclude=./jit --exclude=./.jit-work -czf "$OUT/moe-art.tgz" .
fi
python3 benchmarks/moe_layer.py ${art:+--artifact $art} ${MODELS:+--models $MODELS} ${TOKENS:+--tokens $TOKENS} ${MOE_ARGS:-} --json "$OUT/moe.json" \
  2>&1 | tee "$OUT/moe.log" | tail -40
