#!/usr/bin/env bash
# benchmarks/device_e2e.sh for several models at once, one per GPU (device tool, a multi-GPU kind,
# carry .devsite and, for ARTIFACTS_FROM, .devrun): model i runs on GPU i with its own scratch
# folder. The tool returns at most 8 files, so each model's files come back packed in
# $OUT/<model>.tgz (its artifacts.tgz inside, for a later call's ARTIFACTS_FROM=<folder of
# <model>.tgz>: unpack each and carry its artifacts.tgz as <folder>/<model>.tgz).
# Every other variable is device_e2e.sh's (STEPS=tune, GRAPH_TABLE=1, VARIANTS, ...).
# The models time at once on one host: their eager rows share its cores (each variant's reps
# interleave with the others' of its model, so a model's ratios stay comparable).
set -uo pipefail
. benchmarks/device_setup.sh > "$OUT/setup.txt"  # the carried packages unpacked once, before the models start
models=(${MODELS//,/ })
gpus=$(nvidia-smi -L | wc -l)
if [ ${#models[@]} -gt "$gpus" ]; then echo "${#models[@]} models for $gpus GPUs: one per GPU"; exit 2; fi
for i in "${!models[@]}"; do
  m=${models[$i]}
  mkdir -p /tmp/out-$m
  artifacts=${ARTIFACTS_FROM:+$ARTIFACTS_FROM/$m.tgz}
  (CUDA_VISIBLE_DEVICES=$i MODELS=$m WORK=/tmp/e2e-$m OUT=/tmp/out-$m ARTIFACTS=${artifacts:-} \
     bash benchmarks/device_e2e.sh > /tmp/out-$m/run.log 2>&1
   tar -C /tmp/out-$m -czf $OUT/$m.tgz .) &
done
wait
for m in "${models[@]}"; do echo "== $m"; tail -${TAIL:-12} /tmp/out-$m/run.log; done
