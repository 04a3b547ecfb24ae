#!/usr/bin/env bash
# BENCHMARKS.md §10 on the lent H100 (issue 12: decisions that hold off the grid), in stages that
# fit one device call each (STAGE=...):
#   smoke:    the GPU tests of one-mode timing, then a tiny tune with probes and validation;
#             then falls through to `tune` with the rest of the call;
#   tune:     `lzsolve tune --model llama3-70b --tp 8` with default settings (and TUNE_ARGS, e.g.
#             --full-search or --skip-behind 0.3: issue 16's budgets) into .devrun/d,
#             stopped (SIGINT, records kept) after TUNE_LIMIT s and continued by the next call
#             (the PerfDB and optuna studies travel as $OUT/d.tgz.* parts; carry them back as
#             .devrun/parts); each call's log is $OUT/tune.err;
#   evaluate: `lzsolve evaluate --random ${RANDOM_N:-40} --seed ${SEED:-1}` on the finished artifact, for
#             the signatures matching each glob of EVAL_OPS (default all), into $OUT/eval-N.json;
#   start:    the tune of `tune`, cold and whole, detached (setsid: a device call's limit is 600 s,
#             and the tune takes about that): this call waits up to WAIT_S s (default 540) for it,
#             `finish` (the next call, on the machine still warm) for the rest; the one that sees
#             it end prints the command's wall time and the summary, and packs the artifact;
#   retune:   the tune run again on the artifact (its records reused: only what the code now
#             plans anew is measured), then `evaluate` as above.
# Without JIT caches the artifact travels in one part of a few MB (.devrun/parts/d-lite.tgz,
# from $OUT): evaluation and a continued tune compile what they need again. LITE=1 sends back
# only that part.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$OUT/setup.txt"
if [ ! -d .devrun/d ] && ls .devrun/parts/d.tgz.* > /dev/null 2>&1; then cat .devrun/parts/d.tgz.* | tar xz; fi
if [ ! -d .devrun/d ] && [ -f .devrun/parts/d-lite.tgz ]; then tar xzf .devrun/parts/d-lite.tgz; fi
lz=(python3 -m lzsolve)
pack() {  # the artifact without the JIT work folder (too large to travel), in parts under 16 MiB
  [ -n "${LITE:-}" ] || tar cz --exclude=.jit-work .devrun/d | split -b 15M - "$OUT/d.tgz."
  tar cz --exclude=.jit-work --exclude=jit .devrun/d > "$OUT/d-lite.tgz"
  du -sh .devrun/d .devrun/d/.jit-work 2> /dev/null; ls -la "$OUT"/d*.tgz*
}
start=$(date +%s)
case "${STAGE:?set STAGE=smoke|tune|start|finish|evaluate|retune}" in
  smoke)
    python3 -m pytest -q -p no:cacheprovider tests/test_bench.py tests/test_measure.py -k "mode or reference" 2>&1 | tail -3
    timeout 240 "${lz[@]}" tune --model llama3-8b --grid tiny --trials 0 --kernels 'sdpa.*,fa3.*,triton.rms_norm,torch.*' \
      --out .devrun/smoke --json > "$OUT/smoke.json" 2> "$OUT/smoke.err"
    echo "smoke tune rc=$? after $(( $(date +%s) - start )) s"; tail -3 "$OUT/smoke.err"
    python3 - "$OUT/smoke.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("phases", s["phases"])
for e in s["signatures"]:
    v = e["validation"] or {}
    print(f"  {e['signature'][:60]:60} {e['points_by_phase']} {','.join(e['kernels'])}",
          {k: round(v[k]["vs_default_worst"] or 0, 3) for k in ("before", "after") if k in v})
PY
    ;;&
  smoke|tune)
    left=$(( ${TUNE_LIMIT:-560} - ($(date +%s) - start) ))
    timeout -s INT "$left" "${lz[@]}" tune --model llama3-70b --tp 8 ${TUNE_ARGS-} --out .devrun/d --json > "$OUT/tune.json" \
      2> "$OUT/tune.err"
    echo "tune rc=$? after $(( $(date +%s) - start )) s"; grep -E "in [0-9]+ s|interrupted|wrote|error" "$OUT/tune.err" | tail -8
    pack ;;
  start)
    rm -rf .devrun/d .devrun/detached; mkdir -p .devrun/detached
    setsid nohup bash -c 'date +%s.%N > .devrun/detached/t0
      python3 -m lzsolve tune --model llama3-70b --tp 8 '"${TUNE_ARGS-}"' --out .devrun/d --json \
        > .devrun/detached/tune.json 2> .devrun/detached/tune.err
      echo $? $(date +%s.%N) > .devrun/detached/t1' > /dev/null 2>&1 < /dev/null &
    ;;&
  start|finish)
    while [ ! -f .devrun/detached/t1 ] && [ $(( $(date +%s) - start )) -lt "${WAIT_S:-540}" ]; do sleep 2; done
    cp .devrun/detached/tune.err "$OUT/"
    if [ ! -f .devrun/detached/t1 ]; then
      echo "still tuning after $(( $(date +%s) - start )) s:"; tail -2 .devrun/detached/tune.err; exit 0
    fi
    cp .devrun/detached/tune.json "$OUT/"
    read -r rc t1 < .devrun/detached/t1
    python3 -c "import sys; print(f'tune rc={sys.argv[1]}: {float(sys.argv[3]) - float(sys.argv[2]):.1f} s from the command to its exit')" \
      "$rc" "$(cat .devrun/detached/t0)" "$t1"
    grep -E "in [0-9]+ s|built ahead|wrote|error" .devrun/detached/tune.err | tail -8
    LITE=1 pack ;;
  retune)
    timeout -s INT "${TUNE_LIMIT:-300}" "${lz[@]}" tune --model llama3-70b --tp 8 ${TUNE_ARGS-} --out .devrun/d --json \
      > "$OUT/tune.json" 2> "$OUT/tune.err"
    echo "tune rc=$? after $(( $(date +%s) - start )) s"; grep -E "in [0-9]+ s|interrupted|wrote|error" "$OUT/tune.err" | tail -8
    ;;&
  evaluate|retune)
    LITE=1 pack > /dev/null  # the artifact first, in case the evaluation runs into the call's limit
    n=0
    set -f  # EVAL_OPS holds --op globs, not file names
    for ops in ${EVAL_OPS:-*}; do
      n=$((n + 1)); left=$(( ${EVAL_LIMIT:-560} - ($(date +%s) - start) ))
      [ "$left" -gt 20 ] || break
      timeout -s INT "$left" "${lz[@]}" evaluate .devrun/d --random "${RANDOM_N:-40}" --seed "${SEED:-1}" --op "$ops" \
        --json "$OUT/eval-$n.json" > /tmp/eval.txt 2> /tmp/eval.err
      echo "evaluate $ops rc=$? after $(( $(date +%s) - start )) s"; cat /tmp/eval.txt
      cat /tmp/eval.txt /tmp/eval.err >> "$OUT/eval.log"; grep -E "^(error|note)" /tmp/eval.err | head -10
    done
    pack ;;
esac
