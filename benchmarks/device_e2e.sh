#!/usr/bin/env bash
# On the H100 (device tool, carry .devsite): tune eager tables for the 4-layer models, then
# benchmarks/hf_end_to_end.py (every variant). TUNE_FROM=workload (default) tunes what the
# patched model calls in the benchmark's scenarios (record, then tune --workload); config tunes
# the model's config (tune --config). ARTIFACTS=dir (or an
# artifacts.tgz an earlier call wrote) reuses tables already there, and tunes the missing ones. CHECKS= (empty) keeps the tune's
# probes and validation on (default: off, to fit a call). GRID: the grid the
# workload's buckets are like (full: every recorded length of these scenarios is a bucket).
# GRAPH_TABLE=1 also tunes a graph-mode table of the same calls (ARTIFACTS/graph/<model>): the
# compiled lzsolve variants' table (--graph-artifacts), a compiled client's.
# Figures and logs go to $OUT (e2e.json, e2e.log, record.log, tune-*.log, dispatch-*.json).
set -uo pipefail
mkdir -p /tmp/site && tar -C /tmp/site -xJf .devsite/site.tar.xz
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
models=${MODELS:-llama3-8b}
art=${ARTIFACTS:-/tmp/art}
if [[ "$art" == *.tgz ]]; then  # artifacts.tgz of an earlier call, carried
  mkdir -p /tmp/art && tar -C /tmp/art -xzf "$art" && art=/tmp/art
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
    python3 benchmarks/hf_end_to_end.py --record /tmp/wl --models "$models" --layers "${LAYERS:-4}" > $OUT/record.log 2>&1
    echo "record rc $?"
  else
    python3 benchmarks/hf_end_to_end.py --write-configs /tmp/cfg --models "$models" --layers "${LAYERS:-4}"
  fi
  for table in "${missing[@]}"; do
    read -r m mode out <<< "$table"
    source=$([ "${TUNE_FROM:-workload}" = workload ] && echo "--workload /tmp/wl/$m.json" || echo "--config /tmp/cfg/$m")
    start=$(date +%s)  # the out folder's PerfDB keeps what a cut-off tune measured: it is not measured again
    timeout "${TUNE_S:-240}" python3 -m lzsolve tune $source $tune_args --mode $mode --out $out > $OUT/tune-$m-$mode.log 2>&1
    echo "tune $m $mode rc $? $(( $(date +%s) - start )) s"
    cp $out/dispatch.json $OUT/dispatch-$m-$mode.json
  done
  tar -C "$art" -czf $OUT/artifacts.tgz .  # for ARTIFACTS= in a later call (carried, unpacked)
fi
graph=$([ -d $art/graph ] && echo "--graph-artifacts $art/graph")
python3 benchmarks/hf_end_to_end.py --models "$models" --artifacts "$art" $graph --out $OUT/e2e.json --layers "${LAYERS:-4}" \
  --variants "${VARIANTS:-sdpa,liger,compile,lzsolve}" --reps "${REPS:-10}" ${E2E_ARGS:-} > $OUT/e2e.log 2>&1
echo "e2e rc $?"
tail -${TAIL:-30} $OUT/e2e.log
