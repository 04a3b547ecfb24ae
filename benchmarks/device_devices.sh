#!/usr/bin/env bash
# BENCHMARKS.md §15 (issue 16) on a lent two-GPU machine: one tune on every GPU of the host
# (`--devices all`) against the same tune on one of them, each cold (its own PerfDB, optuna
# studies and JIT caches, in its own folder), then whether the two tables agree
# (benchmarks/tune_agreement.py). The two tunes run one after the other in one detached chain
# (setsid: together they outlast a device call's 600 s), each timed from its command to its exit:
#   STAGE=start   starts the chain (two GPUs first, then cuda:0 alone), waits up to WAIT_S s
#                 (default 540) and reports what finished;
#   STAGE=finish  (the next call, on the machine still warm) waits for the rest, then compares.
# Each call brings back what has finished: $OUT/<name>.json, .err, .time and a tgz of the
# artifact without JIT caches. TUNE_ARGS: the tune (default: the default llama3-70b TP8 tune).
# RUNS: the tunes, "name:options;name:options" (default "two:--devices all;one:--device cuda:0");
# the tables compared are the first run's and the second's, the second's margins deciding. E.g.
# the smarter search budget against the whole one on one GPU (issue 16):
#   RUNS="smart:--device cuda:0;full:--device cuda:0 --full-search" TUNE_ARGS="--model llama3-70b --tp 8 --grid small"
# PARALLEL=1 runs them at once (each on its own GPU: say so in RUNS), so that both fit one call.
# RUNS may name one tune (nothing is compared then). PROFILE=1 runs each tune under cProfile (its
# main thread: the start, the first device's lane, the solve), $OUT/<name>.prof: a diagnosis, not a
# timing. Each run's lanes are shown by benchmarks/lane_timeline.py.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
nvidia-smi -L
start=$(date +%s)
chain=/tmp/devices  # outside the tree: a carried path is replaced on each call, with what it held
runs=$(printf '%s' "${RUNS:-two:--devices all;one:--device cuda:0}" | tr ';' '\n')
first=$(printf '%s\n' "$runs" | sed -n 1p | cut -d: -f1) second=$(printf '%s\n' "$runs" | sed -n 2p | cut -d: -f1)
second=${second:-$first}
case "${STAGE:?set STAGE=start|finish}" in
  start)
    rm -rf "$chain"; mkdir -p "$chain"
    printf '%s\n' "$runs" | while IFS=: read -r name options; do
      rm -rf "/tmp/$name"; echo "run $name $options${PARALLEL:+ &}" >> "$chain/chain.sh"
    done
    [ -n "${PARALLEL:-}" ] && echo wait >> "$chain/chain.sh"
    setsid nohup bash -c '
      run() {  # name, then the device options
        date +%s.%N > '"$chain"'/$1.t0
        python3 '"${PROFILE:+-m cProfile -o $chain/\$1.prof}"' -m lzsolve tune '"${TUNE_ARGS:---model llama3-70b --tp 8}"' "${@:2}" --out /tmp/$1 --json \
          > '"$chain"'/$1.json 2> '"$chain"'/$1.err
        echo $? $(date +%s.%N) > '"$chain"'/$1.t1
      }
      . '"$chain"'/chain.sh' > /dev/null 2>&1 < /dev/null &
    ;;
esac
collect() {  # each finished run's files go to $OUT at once: a call cut at its limit still brings them back
  for name in $(printf '%s\n' $first $second | uniq); do
    [ -f "$chain/$name.err" ] && cp "$chain/$name.err" "$OUT/"
    if [ -f "$chain/$name.t1" ] && [ ! -f "$OUT/$name.time" ]; then
      cp "$chain/$name.json" "$OUT/"
      [ -f "$chain/$name.prof" ] && cp "$chain/$name.prof" "$OUT/"
      tar cz -C /tmp --exclude=.jit-work --exclude=jit "$name" > "$OUT/$name.tgz"
      read -r rc t1 < "$chain/$name.t1"
      python3 -c "import sys; print(f'{sys.argv[1]}: rc={sys.argv[2]}, {float(sys.argv[4]) - float(sys.argv[3]):.1f} s from the command to its exit')" \
        "$name" "$rc" "$(cat "$chain/$name.t0")" "$t1" > "$OUT/$name.time"
    fi
  done
}
# WAIT_S well inside the call's limit, which is less than asked where little device time is left
while [ ! -f "$chain/$second.t1" ] && [ $(( $(date +%s) - start )) -lt "${WAIT_S:-540}" ]; do collect; sleep 2; done
collect
for name in $(printf '%s\n' $first $second | uniq); do
  if [ -f "$OUT/$name.time" ]; then
    cat "$OUT/$name.time"; grep -E "in [0-9]+ s|built ahead|wrote|error" "$chain/$name.err" | tail -6
    python3 benchmarks/lane_timeline.py "/tmp/$name" | head -20
  else
    echo "$name: still tuning after $(( $(date +%s) - start )) s in this call:"; tail -2 "$chain/$name.err" 2> /dev/null
  fi
done
if [ "$first" != "$second" ] && [ -f "$chain/$first.t1" ] && [ -f "$chain/$second.t1" ]; then
  python3 benchmarks/tune_agreement.py compare "/tmp/$second" "/tmp/$first" --mode graph --json "$OUT/agreement.json"
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        s = json.loads(f.read_text())
    except ValueError:
        continue
    if "phases" in s:
        print(f"{f.stem}: wall {s['wall_s']} s, phases {s['phases']}, this process's CPU s "
              f"{s.get('parent_cpu_s')}, measured {s['measured']}, search {s['search'] and s['search']['trials_run']} trials")
PY
