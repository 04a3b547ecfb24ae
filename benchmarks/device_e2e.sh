#!/usr/bin/env bash
# On the H100 (device tool, carry .devsite): tune the 4-layer Llama-3-8B-shaped model for eager
# serving, then benchmarks/hf_end_to_end.py (every variant) and a profile of sdpa vs lzsolve.
# Figures and logs go to $OUT (e2e.json, e2e.log, profile.log, tune.log, dispatch.json).
set -uo pipefail
mkdir -p /tmp/site && tar -C /tmp/site -xJf .devsite/site.tar.xz
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
models=${MODELS:-llama3-8b}
python3 benchmarks/hf_end_to_end.py --write-configs /tmp/cfg --models "$models" --layers 4
for m in ${models//,/ }; do
  timeout "${TUNE_S:-240}" python3 -m lzsolve tune --config /tmp/cfg/$m --grid small --trials 0 --mode eager \
    --no-probe --validate 0 ${TUNE_ARGS:-} --out /tmp/art/$m > $OUT/tune-$m.log 2>&1; echo "tune $m rc $?"
  cp /tmp/art/$m/dispatch.json $OUT/dispatch-$m.json 2>/dev/null
done
python3 benchmarks/hf_end_to_end.py --models "$models" --artifacts /tmp/art --out $OUT/e2e.json \
  --variants "${VARIANTS:-sdpa,liger,compile,lzsolve}" > $OUT/e2e.log 2>&1; echo "e2e rc $?"
tail -20 $OUT/e2e.log
python3 benchmarks/hf_end_to_end.py --models "$models" --artifacts /tmp/art --variants sdpa,lzsolve \
  --scenarios b4s512,gen_b1 --profile --reps 2 --warmup 2 > $OUT/profile.log 2>&1; echo "profile rc $?"
