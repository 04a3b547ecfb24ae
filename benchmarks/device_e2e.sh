#!/usr/bin/env bash
# On the H100 (device tool, carry .devsite): tune eager tables for the 4-layer models, then
# benchmarks/hf_end_to_end.py (every variant). TUNE_FROM=workload (default) tunes what the
# patched model calls in the benchmark's scenarios (record, then tune --workload); config tunes
# the model's config (tune --config). ARTIFACTS=dir (or an artifacts.tgz an earlier call wrote)
# reuses tables already there, and tunes the missing ones. CHECKS= (empty) keeps the tune's
# probes and validation on (default: off, to fit a call). GRID: the grid the
# workload's buckets are like (full: every recorded length of these scenarios is a bucket).
# GRAPH_TABLE=1 also tunes a graph-mode table of the same calls (ARTIFACTS/graph/<model>): the
# compiled lzsolve variants' table (--graph-artifacts), a compiled client's.
# STEPS=tune stops after the tables. WORK: this run's scratch folder (default /tmp/e2e; one per
# model when device_e2e_gpus.sh runs several at once). MODEL_ARGS: given to every
# hf_end_to_end.py call (e.g. "--tiny --device cpu" to try the script on a CPU).
# Figures and logs go to $OUT (e2e.json, e2e.log, record.log, tune-*.log, dispatch-*.json, and
# artifacts.tgz: the tables, their PerfDBs and JIT caches, for ARTIFACTS= later).
set -uo pipefail
. benchmarks/device_setup.sh > "$OUT/setup.txt"
work=${WORK:-/tmp/e2e}
models=${MODELS:-llama3-8b}
art=${ARTIFACTS:-$work/art}
if [[ "$art" == *.tgz ]]; then  # artifacts.tgz of an earlier call, carried: unpacked into a fresh
  # folder of its own, not $work/art, where calls without ARTIFACTS tune and resume (a warm machine
  # keeps /tmp between calls: such a call must not take a carried table, of another GPU maybe, for its own)
  rm -rf $work/carried && mkdir -p $work/carried && tar -C $work/carried -xzf "$art" && art=$work/carried
fi
tune_args="--grid ${GRID:-full} --trials 0 ${CHECKS---no-probe --validate 0} ${TUNE_ARGS:---exclude flashinfer.*,compile.*}"
modes="eager${GRAPH_TABLE:+ graph}"
missing=()  # (model mode out) of each table not there yet: ARTIFACTS' tables are kept, a cut-off tune goes on
for m in ${models//,/ }; do
  for mode in $modes; do
    out=$art/$([ $mode = graph ] && echo graph/)$m
    [ -f $out/dispatch.json ] || missing+=("$m $mode $out")
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${TUNE_FROM:-workload}" = workload ]; then
    python3 benchmarks/hf_end_to_end.py --record $work/wl --models "$models" --layers "${LAYERS:-4}" ${MODEL_ARGS:-} \
      > $OUT/record.log 2>&1
    echo "record rc $?"
  else
    python3 benchmarks/hf_end_to_end.py --write-configs $work/cfg --models "$models" --layers "${LAYERS:-4}" ${MODEL_ARGS:-}
  fi
  for table in "${missing[@]}"; do
    read -r m mode out <<< "$table"
    source=$([ "${TUNE_FROM:-workload}" = workload ] && echo "--workload $work/wl/$m.json" || echo "--config $work/cfg/$m")
    start=$(date +%s)  # the out folder's PerfDB keeps what a cut-off tune measured: it is not measured again
    timeout "${TUNE_S:-240}" python3 -m lzsolve tune $source $tune_args --mode $mode --out $out > $OUT/tune-$m-$mode.log 2>&1
    echo "tune $m $mode rc $? $(( $(date +%s) - start )) s"
    cp $out/dispatch.json $OUT/dispatch-$m-$mode.json
  done
  # the tables with their JIT caches (load checks every file its manifest lists: a table without
  # jit/caches.tar is refused), without the tune's scratch folder; tens of MB where the caches
  # are large, past what the device tool returns a file (its files_left_out says so)
  tar -C "$art" --exclude=.jit-work -czf $OUT/artifacts.tgz .
fi
[ "${STEPS:-tune,e2e}" = tune ] && exit 0
graph=$([ -d $art/graph ] && echo "--graph-artifacts $art/graph")
python3 benchmarks/hf_end_to_end.py --models "$models" --artifacts "$art" $graph --out $OUT/e2e.json --layers "${LAYERS:-4}" \
  --variants "${VARIANTS:-sdpa,liger,compile,lzsolve}" --reps "${REPS:-10}" ${MODEL_ARGS:-} ${E2E_ARGS:-} > $OUT/e2e.log 2>&1
echo "e2e rc $?"
tail -${TAIL:-30} $OUT/e2e.log
