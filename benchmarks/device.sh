#!/usr/bin/env bash
# Everything this project measures on a lent GPU, as stages of one runner (device tool: run from the repo
# root with $OUT set, carry .devsite; a stage that continues an earlier call's work also carries .devrun):
#
#   bash benchmarks/device.sh STAGE [STEP]
#
# Every stage but `session` first runs `setup`: the packages the GPU machine lacks, packed by
# benchmarks/pack_site.sh into .devsite/site.tar.xz (duckdb, optuna, flashinfer, fa3-fwd, liger, fla...),
# unpacked once per machine into /tmp/site (two stages on the two GPUs of one machine share it) and put
# first on PYTHONPATH; what the registry then finds installed goes to $OUT/setup.txt. Each stage's
# environment variables are listed at its function below. Stages (the docs/benchmark-log.md sections they
# produced; each was a script of its own, benchmarks/device_<stage>.sh, before this runner):
#
#   setup          the carried packages unpacked, and what the registry finds (printed)
#   session        §1-§6: the gpu tests, two tunes and their agreement, evaluate, JIT restore, replay, harness
#   parity         every adapter's GPU parity, FlashInfer's in a second process beside the rest
#   tune           §7: the llama3-70b TP8 tune (continued across calls from .devrun/a), then kernel_families.py
#   families       §8: the small member of each model family tuned on the tiny grid
#   suite STEP     §9: STEP tune|layer|quality|ci (tuning_throughput, decoder_layer, decision_quality, the CI step)
#   decisions STEP §10, §15.1-15.2: STEP smoke|tune|start|finish|evaluate|retune of the default llama3-70b TP8 tune
#   e2e            §11, §17: eager (and graph) tables for 4-layer models, then hf_end_to_end.py
#   e2e_gpus       §11.9: `e2e` for several models at once, one per GPU
#   launch         §11.7: the Triton launcher's checks, then launch_overhead.py
#   moe            §12: the MoE kernels' parity, then moe_layer.py (TUNE=1: a table first)
#   flashinfer_moe §12.3: whether FlashInfer's CUTLASS fused MoE builds within a deadline
#   qwen35         §13: Qwen3.5's linear-attention kernels: parity, a table, qwen35_linear_attention.py
#   hardening      §14, §14.4: host_floor.py, replay_overhead.py, load time of a carried artifact
#   jit            §14.1: the JIT archive's size and restore_jit load times (jit_restore.py)
#   devices STEP   §15: STEP start|finish: one tune on every GPU of the host against the same on one GPU
#   fp8            §16: the FP8 kernels' parity, then fp8.py
#   fp8_tune       §16.2-16.7: llama3-70b TP8 as an FP8 deployment, tuned with the FP8 kernels alone
#   batch          the command lines of a file (COMMANDS), detached, over several calls on a warm machine
#   cute STEP      §21, §33: STEP stage|run: FlashAttention-4 and QuACK, carried in two halves (benchmarks/pack_cute.sh)
#
# STEP may also be given as STAGE=STEP in the environment (as the separate scripts took it).
set -u
stage=${1:?usage: bash benchmarks/device.sh STAGE [STEP]; the stages are listed at the top of benchmarks/device.sh}
step=${2:-${STAGE:-}}

setup() {
  # unpacked once per machine: two stages on the two GPUs of one machine share it
  [ -f /tmp/site/.unpacked ] || { mkdir -p /tmp/site && tar xJf .devsite/site.tar.xz -C /tmp/site && touch /tmp/site/.unpacked; } || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16
  python3 - <<'PY'
import torch
from runtime_loader import registry
print("torch", torch.__version__, torch.cuda.get_device_name())
for spec in registry.REGISTRY.values():
    if spec.requires:
        print(f"  {spec.kernel_id:<24} {spec.version() or '-':<10} {spec.installed() or 'available'}")
PY
}

session() {
  # Everything measured on the lent GPU for §1-§6, in one call (no carried packages needed).
  export PYTHONUNBUFFERED=1
  lz() { python3 -c "from lzsolve.cli import main; main()" "$@"; }
  echo "== gpu tests"; python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --tb=line 2>&1 | grep -E "Error|error|passed|failed" | tail -8
  echo "== tune A, B"
  for run in a b; do python3 benchmarks/tune_agreement.py run /tmp/runs/$run --model llama3-70b --tp 8 --device cuda 2>&1 | tail -1; done
  # a tune times its table's mode alone (graph here); the eager agreement needs two --mode eager tunes
  python3 benchmarks/tune_agreement.py compare /tmp/runs/a /tmp/runs/b --mode graph --json "$OUT/agreement_graph.json"
  echo "== evaluate"; lz evaluate /tmp/runs/a --json "$OUT/evaluate_h100.json" 2>&1 | tail -15
  echo "== jit"; python3 benchmarks/jit_restore.py /tmp/runs/a --json "$OUT/jit_restore.json"
  echo "== replay"; python3 benchmarks/replay_overhead.py --device cuda --json "$OUT/replay_overhead.json" | tail -7
  echo "== harness"; python3 benchmarks/harness_agreement.py --json "$OUT/harness_agreement.json" | tail -16
  cp /tmp/runs/a/report.md "$OUT/report_h100.md"
  tar czf "$OUT/h100_artifact.tgz" -C /tmp/runs --exclude=.jit-work a; ls -la "$OUT"
}

parity() {
  # GPU parity of every adapter, in one device call: FlashInfer (JIT-compiles per kernel variant)
  # in a second process beside the rest, so its compiles overlap the others' checks.
  run() { timeout 520 python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short "$@"; }
  LZSOLVE_TEST_KERNELS='flashinfer.*' run tests/test_kernels.py > "$OUT/parity_flashinfer.log" 2>&1 &
  LZSOLVE_TEST_EXCLUDE='flashinfer.*' run tests/ > "$OUT/parity_rest.log" 2>&1
  wait
  for log in "$OUT"/parity_*.log; do echo "== $log"; grep -vE "^ok " "$log" | tail -40; done
  grep -hE "^ok " "$OUT"/parity_*.log | sort -k2 -n -r | head -12
}

tune() {
  # One device call of the llama3-70b TP8 tuning run behind §7's kernel-family tables. The run
  # continues what .devrun/a holds (PerfDB and optuna studies carried back from an earlier call that
  # ran out of time), so a tune longer than one call finishes over several. TUNE_LIMIT (540 s), TRIALS (6).
  mkdir -p .devrun/a
  start=$(date +%s)
  timeout -s INT "${TUNE_LIMIT:-540}" python3 -c "from lzsolve.cli import main; main()" tune --model llama3-70b --tp 8 \
    --device cuda --trials "${TRIALS:-6}" --out .devrun/a 2> "$OUT/tune.err" | tee "$OUT/tune.out"
  echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; tail -3 "$OUT/tune.err"
  tar czf "$OUT/devrun.tgz" --exclude=.jit-work .devrun
  [ -f .devrun/a/dispatch.json ] && python3 benchmarks/kernel_families.py .devrun/a --json "$OUT/kernel_families.json"
}

families() {
  # The small member of each model family, tuned on the GPU (tiny grid: this shows the pipeline works
  # for every family there; the timing figures of record are the llama3-70b runs). MODELS (default: the
  # five below), PARITY=1 (the adapters' new feature combinations first), LIMIT (240 s a model), EXTRA
  # (more tune options), e.g. MODELS="gpt2 qwen3-0.6b" PARITY=1 bash benchmarks/device.sh families
  if [ "${PARITY:-0}" = 1 ]; then  # the adapters' new feature combinations (window, softcap, unit_offset, new ops)
    LZSOLVE_TEST_EXCLUDE='flashinfer.*' timeout 300 python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short \
      tests/test_kernels.py > "$OUT/parity.log" 2>&1
    grep -vE "^ok " "$OUT/parity.log" | tail -15
  fi
  for model in ${MODELS:-gpt2 qwen2-0.5b qwen3-0.6b qwen3.5-0.8b gemma3-270m}; do
    start=$(date +%s)
    timeout -s INT "${LIMIT:-240}" python3 -c "from lzsolve.cli import main; main()" tune --model "$model" \
      --device cuda --grid tiny --trials 2 ${EXTRA:-} --out "/tmp/runs/$model" > "$OUT/$model.out" 2> "$OUT/$model.err"
    echo "== $model rc=$? $(( $(date +%s) - start ))s"; grep "^note" "$OUT/$model.err" | cut -c1-200; tail -n +2 "$OUT/$model.out"
  done
}

suite() {
  # §9 in steps that fit one device call each:
  #   tune:    tuning_throughput.py (llama3-70b TP8, default grid, cold then warm; TRIALS, default 0) into
  #            .devrun/suite, then the artifact comes back as $OUT/suite.tgz.* (carry those parts to the next
  #            steps, which unpack them: .devrun/suite holds ~72 MB of JIT caches, over what a call carries);
  #   layer:   decoder_layer.py on that artifact (RESTORE_JIT=1: with its JIT caches restored);
  #   quality: decision_quality.py (lzsolve evaluate) on it, and replay_overhead.py;
  #   ci:      ci/tune_artifacts.py twice on llama3-8b (tiny grid), the second run gated on the first
  #            (CI_TUNE_ARGS: more tune options).
  if [ "${step:?set the step: suite tune|layer|quality|ci}" != tune ] && ls .devrun/parts/suite.tgz.* > /dev/null 2>&1; then cat .devrun/parts/suite.tgz.* | tar xz; fi
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$OUT/setup.txt"
  case "$step" in
    tune)
      python3 benchmarks/tuning_throughput.py --model llama3-70b --tp 8 --out .devrun/suite --json "$OUT/tuning.json" \
        -- --device cuda --trials "${TRIALS:-0}" 2> "$OUT/tune.err"
      echo "tune rc=$?"; tail -2 "$OUT/tune.err"
      # the artifact with its JIT caches, in parts under the 16 MiB a returned file may have
      # (cat suite.tgz.* | tar xz; the next steps carry the parts, not the ~80 MB folder)
      tar cz --exclude=.jit-work .devrun/suite | split -b 15M - "$OUT/suite.tgz."
      ls -la "$OUT"/suite.tgz.* ;;
    layer)
      python3 benchmarks/decoder_layer.py .devrun/suite ${RESTORE_JIT:+--restore-jit} --json "$OUT/layer.json" 2>&1 \
        | tee "$OUT/layer.txt" ;;
    quality)
      python3 benchmarks/replay_overhead.py --device cuda --json "$OUT/replay.json" | tee "$OUT/replay.txt"
      python3 benchmarks/decision_quality.py .devrun/suite --json "$OUT/quality.json" 2> "$OUT/quality.err" \
        | tee "$OUT/quality.txt"
      tail -3 "$OUT/quality.err" ;;
    ci)
      python3 ci/tune_artifacts.py --out .devrun/ci1 llama3-8b -- --grid tiny ${CI_TUNE_ARGS:-} 2> "$OUT/ci1.err"
      echo "first run rc=$?"; cp .devrun/ci1/summary.md "$OUT/ci1.md"
      python3 ci/tune_artifacts.py --out .devrun/ci2 --baseline .devrun/ci1 llama3-8b -- --grid tiny ${CI_TUNE_ARGS:-} \
        2> "$OUT/ci2.err"
      echo "gated run rc=$?"; cp .devrun/ci2/summary.md "$OUT/ci2.md"; cp .devrun/ci2/summary.json "$OUT/ci2.json"
      cat "$OUT/ci1.md" "$OUT/ci2.md"; grep -A20 "vs baseline" "$OUT/ci2.err" ;;
    *) echo "suite: unknown step '$step' (tune|layer|quality|ci)"; exit 2 ;;
  esac
}

decisions() {
  # §10 and §15.1-15.2 (issue 12: decisions that hold off the grid; issue 16's default tune), in steps
  # that fit one device call each:
  #   smoke:    the GPU tests of one-mode timing, then a tiny tune with probes and validation;
  #             then falls through to `tune` with the rest of the call;
  #   tune:     `lzsolve tune --model llama3-70b --tp 8` with default settings (and TUNE_ARGS, e.g.
  #             --full-search or --skip-behind 0.3: issue 16's budgets) into .devrun/d,
  #             stopped (SIGINT, records kept) after TUNE_LIMIT s and continued by the next call
  #             (the PerfDB and optuna studies travel as $OUT/d.tgz.* parts; carry them back as
  #             .devrun/parts); each call's log is $OUT/tune.err;
  #   evaluate: `lzsolve evaluate --random ${RANDOM_N:-40} --seed ${SEED:-1}` on the finished artifact, for
  #             the signatures matching each glob of EVAL_OPS (default all), into $OUT/eval-N.json
  #             (EVAL_LIMIT: the seconds the step may spend, default 560);
  #   start:    the tune of `tune`, cold and whole, detached (setsid: a device call's limit is 600 s,
  #             and the tune takes about that): this call waits up to WAIT_S s (default 540) for it,
  #             `finish` (the next call, on the machine still warm) for the rest; the one that sees
  #             it end prints the command's wall time and the summary, and packs the artifact;
  #   retune:   the tune run again on the artifact (its records reused: only what the code now
  #             plans anew is measured), then `evaluate` as above.
  # Without JIT caches the artifact travels in one part of a few MB (.devrun/parts/d-lite.tgz,
  # from $OUT): evaluation and a continued tune compile what they need again. LITE=1 sends back
  # only that part.
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
  case "${step:?set the step: decisions smoke|tune|start|finish|evaluate|retune}" in
    smoke)
      python3 -m pytest -q -p no:cacheprovider tests/test_harness.py tests/test_tasks.py -k "mode or reference" 2>&1 | tail -3
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
    *) echo "decisions: unknown step '$step' (smoke|tune|start|finish|evaluate|retune)"; exit 2 ;;
  esac
}

e2e() {
  # Tune eager tables for the 4-layer models, then benchmarks/hf_end_to_end.py (every variant).
  # MODELS (comma list, default llama3-8b), LAYERS (4). TUNE_FROM=workload (default) tunes what the
  # patched model calls in the benchmark's scenarios (record, then tune --workload); config tunes
  # the model's config (tune --config). ARTIFACTS=dir (or an artifacts.tgz an earlier call wrote)
  # reuses tables already there, and tunes the missing ones. CHECKS= (empty) keeps the tune's
  # probes and validation on (default: off, to fit a call). GRID: the grid the workload's buckets
  # are like (full: every recorded length of these scenarios is a bucket). TUNE_ARGS (default
  # --exclude flashinfer.*,compile.*), TUNE_S (240 s a table); TUNE_OPTS replaces all of those options (e.g.
  # "--mode eager": a tune with default settings, as a user runs it; the tables' mode is still eager).
  # GRAPH_TABLE=1 also tunes a graph-mode table of the same calls (ARTIFACTS/graph/<model>): the
  # compiled lzsolve variants' table (--graph-artifacts), a compiled client's.
  # STEPS=tune stops after the tables. WORK: this run's scratch folder (default /tmp/e2e; one per
  # model when the e2e_gpus stage runs several at once). MODEL_ARGS: given to every
  # hf_end_to_end.py call (e.g. "--tiny --device cpu" to try the script on a CPU). VARIANTS, REPS,
  # E2E_ARGS (e.g. --profile), TAIL: the benchmark's variants, repetitions, more options, lines shown.
  # Figures and logs go to $OUT (e2e.json, e2e.log, record.log, tune-*.log, dispatch-*.json, and
  # artifacts.tgz: the tables, their PerfDBs and JIT caches, for ARTIFACTS= later).
  set -o pipefail
  work=${WORK:-/tmp/e2e}
  models=${MODELS:-llama3-8b}
  art=${ARTIFACTS:-$work/art}
  if [[ "$art" == *.tgz ]]; then  # artifacts.tgz of an earlier call, carried: unpacked into a fresh
    # folder of its own, not $work/art, where calls without ARTIFACTS tune and resume (a warm machine
    # keeps /tmp between calls: such a call must not take a carried table, of another GPU maybe, for its own)
    rm -rf $work/carried && mkdir -p $work/carried && tar -C $work/carried -xzf "$art" && art=$work/carried
  fi
  tune_args=${TUNE_OPTS:-"--grid ${GRID:-full} --trials 0 ${CHECKS---no-probe --validate 0} ${TUNE_ARGS:---exclude flashinfer.*,compile.*}"}
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
}

e2e_gpus() {
  # The e2e stage for several models at once, one per GPU (a multi-GPU kind; carry .devsite and, for
  # ARTIFACTS_FROM, .devrun): model i runs on GPU i with its own scratch folder. The tool returns at most
  # 8 files, so each model's files come back packed in $OUT/<model>.tgz (its artifacts.tgz inside, for a
  # later call's ARTIFACTS_FROM=<folder of <model>.tgz>: unpack each and carry its artifacts.tgz as
  # <folder>/<model>.tgz). Every other variable is the e2e stage's (STEPS=tune, GRAPH_TABLE=1, VARIANTS, ...).
  # The models time at once on one host: their eager rows share its cores (each variant's reps
  # interleave with the others' of its model, so a model's ratios stay comparable).
  set -o pipefail
  models=(${MODELS//,/ })
  gpus=$(nvidia-smi -L | wc -l)
  if [ ${#models[@]} -gt "$gpus" ]; then echo "${#models[@]} models for $gpus GPUs: one per GPU"; exit 2; fi
  for i in "${!models[@]}"; do
    m=${models[$i]}
    mkdir -p /tmp/out-$m
    artifacts=${ARTIFACTS_FROM:+$ARTIFACTS_FROM/$m.tgz}
    (CUDA_VISIBLE_DEVICES=$i MODELS=$m WORK=/tmp/e2e-$m OUT=/tmp/out-$m ARTIFACTS=${artifacts:-} \
       bash benchmarks/device.sh e2e > /tmp/out-$m/run.log 2>&1
     tar -C /tmp/out-$m -czf $OUT/$m.tgz .) &
  done
  wait
  for m in "${models[@]}"; do echo "== $m"; tail -${TAIL:-12} /tmp/out-$m/run.log; done
}

batch() {
  # The command lines of the file COMMANDS, one after another, in a process session of their own
  # (setsid), so that they run on past one device call's 600 s: the call that finds none running
  # starts them, and each call on the still-warm machine (this stage again; COMMANDS is then
  # ignored) waits up to WAIT_S (540 s; keep it 60 s under the call's limit, which is the device time
  # left when that is less than asked) for them to end, then packs what they wrote so far as
  # $OUT/batch.tgz.* (parts under 16 MiB; cat batch.tgz.* | tar xz): each line runs with bash
  # from the repo root, with OUT=/tmp/batch/out/<line number> (its log: that folder's log) and
  # the carried packages set up; /tmp/batch/progress has each line's exit code and seconds.
  # Files named artifacts.tgz (tables with their JIT caches) stay behind.
  root=/tmp/batch
  if [ ! -f $root/started ]; then
    [ -f "${COMMANDS:-}" ] || { echo "batch: COMMANDS=${COMMANDS:-}: no such file"; exit 2; }
    rm -rf $root && mkdir -p $root/out && grep -v '^\s*\(#\|$\)' "$COMMANDS" > $root/commands && date +%s > $root/started
    setsid nohup bash -c 'n=0
      while IFS= read -r line; do
        n=$((n + 1)); mkdir -p '$root'/out/$n; start=$(date +%s)
        OUT='$root'/out/$n bash -c "$line" > '$root'/out/$n/log 2>&1 < /dev/null
        echo "$n rc=$? $(( $(date +%s) - start )) s: $line" >> '$root'/progress
      done < '$root'/commands
      touch '$root'/done' > /dev/null 2>&1 < /dev/null &
  fi
  # What the lines wrote so far is packed every PACK_S (120 s) while waiting, and when the call is
  # stopped: a call the device tool ends at its limit (which is less than asked when little device
  # time is left) still returns what its last pack holds, where one that packed only at the end
  # returned nothing.
  pack() {
    rm -f "$OUT"/batch.tgz.*
    tar -C $root --exclude=artifacts.tgz -cz commands progress out 2> /dev/null | split -b 15M - "$OUT/batch.tgz."
  }
  trap 'pack; exit 124' TERM INT
  start=$(date +%s) packed=$(date +%s)
  while [ ! -f $root/done ] && [ $(( $(date +%s) - start )) -lt "${WAIT_S:-540}" ]; do
    sleep 5
    [ $(( $(date +%s) - packed )) -ge "${PACK_S:-120}" ] && { pack; packed=$(date +%s); }
  done
  cut -c1-160 $root/progress 2> /dev/null
  if [ -f $root/done ]; then echo "batch done"; else echo "batch running: line $(( $(wc -l < $root/progress 2> /dev/null || echo 0) + 1 ))"; fi
  pack
  ls -la "$OUT"
}

cute() {
  # NVIDIA's CuTe DSL kernels (issue 58): FlashAttention-4 and QuACK, and FlashInfer 0.7.4 where
  # benchmarks/pack_cute.sh --flashinfer packed it, whose wheels come in parts of a call each on one
  # warm machine (pack_cute.sh says how; no .devsite in those calls: a part fills one). STEP stage:
  # the parts this call carried (.cute/<letter>) parked in /tmp/cute-parts; run: those too, then the
  # tar put together and checked, the wheels installed into /tmp/cute/site (first on PYTHONPATH) and
  # FlashInfer 0.7.4's into /tmp/cute/fi (exported as FLASHINFER_07, for commands that put it first
  # on their PYTHONPATH); then the adapters' GPU parity (tests/test_kernels.py, fa4.* and quack.*) and
  # benchmarks/cute_candidates.py, or, where CUTE_THEN is set, that command line instead (a tune and
  # decoder_layer.py with FA4 and QuACK among the candidates: call `setup` with .devsite first on the
  # same machine, for DuckDB, optuna, FA3...).
  mkdir -p /tmp/cute-parts
  for part in .cute/*/; do [ -d "$part" ] && cp "$part"* /tmp/cute-parts/; done
  case "${step:?set the step: cute stage|run}" in
    stage) ls -la /tmp/cute-parts ;;
    run)
      local want have
      want=$(cat /tmp/cute-parts/wheels.tar.parts 2> /dev/null || echo "?")
      have=$(ls /tmp/cute-parts/wheels.tar.[0-9][0-9] 2> /dev/null | wc -l)
      [ "$want" = "$have" ] || { echo "cute run: $have of $want parts in /tmp/cute-parts (the machine went back"\
        "between the calls, or a part was not staged): stage every part again, then this at once"; exit 2; }
      (cd /tmp/cute-parts && cat wheels.tar.[0-9][0-9] > wheels.tar && sha256sum -c wheels.tar.sha256) || exit 2
      mkdir -p /tmp/cute/wheels && tar -xf /tmp/cute-parts/wheels.tar -C /tmp/cute/wheels
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cute/site /tmp/cute/wheels/*.whl || exit 1
      if [ -d /tmp/cute/wheels/fi ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cute/fi /tmp/cute/wheels/fi/*.whl || exit 1
        export FLASHINFER_07=/tmp/cute/fi
      fi
      # the CuTe DSL's own .pth puts its dsl_packages on sys.path, which a PYTHONPATH folder does not read
      # /tmp/site: the .devsite packages (FA3, FlashInfer 0.5.3...), where an earlier call on this machine unpacked them
      export PYTHONPATH=/tmp/cute/site:/tmp/cute/site/nvidia_cutlass_dsl/dsl_packages$([ -f /tmp/site/.unpacked ] && echo :/tmp/site):$PWD
      export PYTHONUNBUFFERED=1
      if [ -n "${CUTE_THEN:-}" ]; then bash -c "$CUTE_THEN"; return; fi
      LZSOLVE_TEST_KERNELS='fa4.*,quack.*' timeout "${PARITY_S:-300}" python3 -m pytest -q -m gpu -s -p no:cacheprovider \
        --tb=short tests/test_kernels.py > "$OUT/parity.log" 2>&1
      echo "parity rc $?"; grep -vE "^ok " "$OUT/parity.log" | tail -20
      python3 benchmarks/cute_candidates.py ${CUTE_ARGS:-} --json "$OUT/cute.json" 2>&1 | tee "$OUT/cute.txt" ;;
    *) echo "cute: unknown step '$step' (stage|run)"; exit 2 ;;
  esac
}

launch() {
  # §11.7 (issue 14): our Triton kernels through the launcher (runtime_loader/kernels/triton_ops/launch.py).
  # First its checks: the launcher's key against Triton's own binder, and every Triton kernel's parity
  # with the fp32 reference (tests/test_kernels.py checks each case twice with fresh inputs: the second
  # call of a key is the launcher's direct launch; TESTS= other tests, e.g. all of tests/test_kernels.py
  # for the search spaces' corners too; PARITY_S, default 400 s); then benchmarks/launch_overhead.py,
  # ROUNDS times (2). KERNELS= other kernel globs for the parity run (default triton.*).
  LZSOLVE_TEST_KERNELS="${KERNELS:-triton.*}" timeout "${PARITY_S:-400}" python3 -m pytest -q -m gpu -s -p no:cacheprovider \
    --tb=short ${TESTS:-tests/test_triton_launch.py tests/test_kernels.py::test_cuda_kernel_parity} \
    > "$OUT/parity_triton.log" 2>&1
  echo "parity rc $?"; grep -vE "^ok " "$OUT/parity_triton.log" | tail -15
  for round in $(seq "${ROUNDS:-2}"); do
    python3 benchmarks/launch_overhead.py --json "$OUT/launch-$round.json" | tee "$OUT/launch-$round.txt"
  done
}

moe() {
  # The mixture-of-experts kernels' parity (every contract case, the search spaces' corners, the sort's
  # rows), then benchmarks/moe_layer.py. TUNE=1 first tunes a table for the benchmark's workload
  # (TUNE_ARGS, default --trials 8; TUNE_S, default 400 s) and packs it as $OUT/moe-art.tgz;
  # ARTIFACT=dir|.tgz (carried) reuses one. TOKENS= limits the token counts (comma list); PARITY=0 skips
  # the parity run; MODELS= the benchmark's models to tune and time (comma list); MOE_ARGS= more arguments
  # for moe_layer.py (e.g. --max-loop-tokens 256).
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
}

flashinfer_moe() {
  # §12.3: can FlashInfer's CUTLASS fused MoE serve moe.experts here? FlashInfer ships it as JIT source:
  # the first call builds one module per GPU architecture from 176 CUDA files (22 in the wheel plus 154
  # CUTLASS instantiations generated for sm90; counted by running its generate_gemm_operations on CPU,
  # 2026-11-26). This times that build under a deadline (BUILD_S, default 540 s) with MAX_JOBS=16 and
  # reports how many objects were compiled; when the module loads, it checks cutlass_fused_moe against
  # the op's fp32 reference on a small Mixtral-shaped call (gate_up passed as [up; gate], the row order
  # its gated activation reads) and times it against torch.grouped_mm in the project's harness. Details under $OUT.
  export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
  start=$(date +%s)
  timeout "${BUILD_S:-540}" python3 -c "
from flashinfer.fused_moe.core import get_cutlass_fused_moe_module
get_cutlass_fused_moe_module('90')" > "$OUT/build.log" 2>&1
  rc=$?
  echo "build rc $rc after $(( $(date +%s) - start )) s"
  ops=$(find /tmp/fi-ws -path '*fused_moe_90*' \( -name '*.o' -o -name '*.cuda.o' \) | wc -l)
  echo "objects compiled: $ops (of 176 sources)"
  tail -3 "$OUT/build.log"
  [ "$rc" = 0 ] || exit 0
  python3 - <<'PY' 2>&1 | tee "$OUT/parity.log"
import sys, torch
sys.path.insert(0, "benchmarks")
from checked_timing import timed
from flashinfer.fused_moe import cutlass_fused_moe
from lzsolve.measure.harness import make_harness
from lzsolve.ops import compare, CONTRACTS
from lzsolve.ops.moe import reference
from runtime_loader.kernels import builtin

torch.manual_seed(0)
device = torch.device("cuda")
harness = make_harness(device)
tolerance = CONTRACTS["moe.experts"].tolerances["bf16"]
experts, top_k, hidden, inter = 8, 2, 4096, 7168  # Mixtral-8x7B at TP2
gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16) / hidden ** 0.5
down = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16) / inter ** 0.5
up_gate = torch.cat([gate_up[:, inter:], gate_up[:, :inter]], dim=1).contiguous()  # FlashInfer's row order (its tests: w31 = [w3 (up); w1 (gate)])
for tokens in (1, 64, 1024, 4096):
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    weights, ids = torch.randn(tokens, experts, device=device).softmax(-1).topk(top_k, dim=-1)
    flashinfer = lambda: cutlass_fused_moe(x, ids.int(), weights, up_gate, down, torch.bfloat16, quant_scales=None)[0]
    grouped = lambda: builtin.moe_experts(x, ids, weights, gate_up, down)
    ref = reference(x.float(), ids, weights, gate_up.float(), down.float())
    ok, _, message = compare(flashinfer(), ref, tolerance)
    us = timed(harness, {"flashinfer": [flashinfer], "grouped_mm": [grouped]}) if ok else {}
    print(f"tokens {tokens:5d}: {'agrees' if ok else 'DISAGREES: ' + message}  {us}")
PY
}

qwen35() {
  # §13 (issue 20: Qwen3.5's Gated DeltaNet layers), in one device call: the GPU parity tests of the new
  # kernels, then what the patched layer calls at the benchmark's shapes recorded and tuned (eager mode,
  # as the layer is served), then the benchmark itself. PARITY_KERNELS narrows the parity tests
  # (PARITY_LIMIT, default 240 s), TUNE_LIMIT (240 s), TRIALS (0), KERNELS (*) the tune's, PROFILE=1 adds
  # the benchmark's profiles ($OUT/prof). Everything it writes is under $OUT: parity.txt, tune.err,
  # report.md, q35.tgz (the table: carry it back as .devrun/parts/q35.tgz and the next call benchmarks it
  # without tuning again), bench.txt, qwen35.json.
  grep -E "^torch|fla\.|triton\.sigmoid" "$OUT/setup.txt"
  python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)"
  start=$(date +%s)
  # tests/test_kernels.py's GPU parity checks, for the new kernels only (FLA's chunk sizes at the corners of its space)
  LZSOLVE_TEST_KERNELS="${PARITY_KERNELS:-fla.*,*sigmoid_gate,*causal_conv1d,*deltanet*}" timeout "${PARITY_LIMIT:-240}" \
    python3 -m pytest -q -m gpu -s -p no:cacheprovider --tb=short tests/test_kernels.py \
    -k "cuda_kernel_parity or searched_configs" > "$OUT/parity.txt" 2>&1
  echo "parity rc=$? after $(( $(date +%s) - start )) s"; grep -vE "^ok " "$OUT/parity.txt" | tail -12
  python3 benchmarks/qwen35_linear_attention.py --record /tmp/w.json 2> "$OUT/record.err" || tail -5 "$OUT/record.err"
  if [ -f .devrun/parts/q35.tgz ]; then  # the table of an earlier call (its $OUT/q35.tgz, carried back)
    tar xzf .devrun/parts/q35.tgz -C /tmp && echo "table from .devrun/parts/q35.tgz"
  else
    timeout "${TUNE_LIMIT:-240}" python3 -m lzsolve tune --workload /tmp/w.json --mode eager --no-probe --validate 0 \
      --trials "${TRIALS:-0}" --kernels "${KERNELS:-*}" --exclude 'compile.*,triton.linear' --out /tmp/art > /dev/null 2> "$OUT/tune.err"
    echo "tune rc=$? after $(( $(date +%s) - start )) s"; grep -E "error|wrote|in [0-9]+ s" "$OUT/tune.err" | tail -4
    tar cz -C /tmp --exclude=.jit-work art > "$OUT/q35.tgz"
  fi
  cp /tmp/art/report.md "$OUT/" 2> /dev/null
  python3 benchmarks/qwen35_linear_attention.py --artifact /tmp/art --json "$OUT/qwen35.json" ${PROFILE:+--profile "$OUT/prof"} 2> "$OUT/bench.err" \
    | tee "$OUT/bench.txt"  # each scenario's line as it is measured: a call cut by its limit keeps them
  [ "${PIPESTATUS[0]}" = 0 ] || tail -8 "$OUT/bench.err"
  echo "done after $(( $(date +%s) - start )) s"
}

hardening() {
  # §14 and §14.4 (issue 17's host figures): what a call's pieces cost in Python there and, in C++, the key
  # (host_floor.py --cpp; HOST_FLOOR_ARGS= for Python alone), replay overhead
  # (benchmarks/replay_overhead.py, twice; REPLAY_RUNS="1" for one) and the load time of the llama3-70b
  # TP8 artifact in fresh processes (carried as .devrun/parts/d-lite.tgz, from the decisions stage:
  # no JIT archive, so restore_jit has nothing to restore).
  python3 benchmarks/host_floor.py --device cuda ${HOST_FLOOR_ARGS---cpp} --json "$OUT/host_floor.json" | tee "$OUT/host_floor.txt"
  for run in ${REPLAY_RUNS-1 2}; do
    python3 benchmarks/replay_overhead.py --device cuda --json "$OUT/replay-$run.json" | tee "$OUT/replay-$run.txt"
  done
  [ -d .devrun/d ] || tar xzf .devrun/parts/d-lite.tgz 2> /dev/null || { echo "no artifact carried: load time not measured"; exit 0; }
  cat > /tmp/load.py <<'PY'
import sys, time
start = time.perf_counter()
import runtime_loader
imported = time.perf_counter()
d = runtime_loader.load(".devrun/d")
loaded = time.perf_counter() - imported
libraries = sorted({m.split(".")[0] for m in sys.modules} & {"flashinfer", "flash_attn", "flash_attn_interface", "liger_kernel", "fla", "triton"})
print(f"import runtime_loader (torch) {imported - start:.3f} s, load() {loaded:.3f} s; kernel libraries imported: {', '.join(libraries) or 'none'}")
PY
  for run in 1 2 3; do python3 /tmp/load.py; done | tee "$OUT/load.txt"
}

jit() {
  # §14.1 (issue 17's JIT figures): a cold llama3-70b TP8 tune (small grid, no search: one device call;
  # TUNE_LIMIT, default 420 s), the size of its JIT archive (only the files the chosen kernels' first
  # calls wrote) against packing the same run's caches whole (what artifacts held before), and the load
  # time of fresh processes with restore_jit, with and without warm-up (benchmarks/jit_restore.py,
  # RESTORE_RUNS times: default "1 2 3").
  start=$(date +%s)
  timeout -s INT "${TUNE_LIMIT:-420}" python3 -m lzsolve tune --model llama3-70b --tp 8 --device cuda --grid small \
    --trials 0 --out .devrun/j 2> "$OUT/tune.err" | tee "$OUT/tune.out" | tail -4
  echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"
  cp .devrun/j/dispatch.json .devrun/j/report.md "$OUT/" 2>/dev/null
  python3 - <<'PY' | tee "$OUT/jit_sizes.txt"
import json, tarfile, tempfile
from pathlib import Path
from runtime_loader import jit
art = Path(".devrun/j")
table = json.loads((art / "dispatch.json").read_text())
archive = art / table["jit"]["archive"]
kinds = {kind for k in table["kernels"].values() for kind in k["jit_caches"]}
work = art / ".jit-work"
raw = {k: sum(p.stat().st_size for p in (work / k).rglob("*") if p.is_file()) for k in sorted(kinds) if (work / k).is_dir()}
print("the caches as the run left them: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in raw.items()))
with tempfile.TemporaryDirectory() as tmp:
    whole = Path(tmp) / "whole.tar"
    jit.pack(art / ".jit-work", kinds, whole)
    for name, path in (("per-kernel archive (the artifact's)", archive), ("the same caches packed whole", whole)):
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        by_kind = {}
        for m in members:
            by_kind[m.name.split("/")[0]] = by_kind.get(m.name.split("/")[0], 0) + m.size
        print(f"{name}: {path.stat().st_size / 2**20:.1f} MiB, {len(members)} members; "
              + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(by_kind.items())))
        folders, suffixes = {}, {}
        for m in members:
            folder = "/".join(m.name.split("/")[:3])
            folders[folder] = folders.get(folder, 0) + m.size
            suffix = m.name.rsplit(".", 1)[-1] if "." in m.name.split("/")[-1] else "-"
            suffixes[suffix] = suffixes.get(suffix, 0) + m.size
        top = sorted(folders.items(), key=lambda kv: -kv[1])[:6]
        print("  largest folders: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in top))
        print("  by suffix (MiB): " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sorted(suffixes.items(), key=lambda kv: -kv[1])[:8]))
print("table kernels with JIT caches:", sorted(k for k, v in table["kernels"].items() if v["jit_caches"]))
PY
  for run in ${RESTORE_RUNS-1 2 3}; do
    timeout 120 python3 benchmarks/jit_restore.py .devrun/j --modes restored,lazy --json "$OUT/restore-$run.json" | tail -2
  done | tee "$OUT/restore.txt"
}

devices() {
  # §15 (issue 16) on a lent two-GPU machine: one tune on every GPU of the host (`--devices all`) against
  # the same tune on one of them, each cold (its own PerfDB, optuna studies and JIT caches, in its own
  # folder), then whether the two tables agree (benchmarks/tune_agreement.py). The two tunes run one after
  # the other in one detached chain (setsid: together they outlast a device call's 600 s), each timed from
  # its command to its exit:
  #   start   starts the chain (two GPUs first, then cuda:0 alone), waits up to WAIT_S s
  #           (default 540) and reports what finished;
  #   finish  (the next call, on the machine still warm) waits for the rest, then compares.
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
  nvidia-smi -L
  start=$(date +%s)
  chain=/tmp/devices  # outside the tree: a carried path is replaced on each call, with what it held
  runs=$(printf '%s' "${RUNS:-two:--devices all;one:--device cuda:0}" | tr ';' '\n')
  first=$(printf '%s\n' "$runs" | sed -n 1p | cut -d: -f1) second=$(printf '%s\n' "$runs" | sed -n 2p | cut -d: -f1)
  second=${second:-$first}
  case "${step:?set the step: devices start|finish}" in
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
    finish) ;;
    *) echo "devices: unknown step '$step' (start|finish)"; exit 2 ;;
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
}

fp8() {
  # §16 (issue 18: FP8 linears and the FP8 KV cache), in one device call: the GPU parity tests of the FP8
  # kernels and their search spaces' corners (tests/test_kernels.py; PARITY_LIMIT, default 150 s), then
  # benchmarks/fp8.py (FP8_ARGS=--no-decode: the linears alone; --pairs: q/k/v and gate/up with the norm
  # before them, the quantisation in the linear or in the norm).
  grep -E "^torch|flashinfer.decode" "$OUT/setup.txt"
  LZSOLVE_TEST_KERNELS='*fp8*,torch.scaled_mm' timeout "${PARITY_LIMIT:-150}" python3 -m pytest -q -m gpu -s -p no:cacheprovider \
    --tb=short tests/test_kernels.py -k "cuda_kernel_parity or searched_configs" > "$OUT/parity.txt" 2>&1
  echo "parity rc=$?"; grep -vE "^ok " "$OUT/parity.txt" | tail -12
  python3 benchmarks/fp8.py --json "$OUT/fp8.json" ${FP8_ARGS-} 2> "$OUT/fp8.err" || tail -8 "$OUT/fp8.err"
}

fp8_tune() {
  # §16.2-16.7 (issue 18): llama3-70b TP8 as an FP8 W8A8 deployment, tuned cold with the FP8 kernels alone
  # (the linears', and the norms' and SwiGLU's that quantise for the linear after them; every other op
  # keeps its fallback, so the call fits), the Triton families searched (TRIALS per bucket, default 6) on
  # GRID (small: tokens 1-64; full: to 16384), within TUNE_LIMIT s (480). Prints the table's end and keeps
  # its dispatch.json and report under $OUT. BENCH=1: then benchmarks/fp8.py --pairs with the table's
  # kernels among the candidates (against bf16 in the same run; FP8_ARGS: more options). TABLE=dir
  # (carried: its dispatch.json) skips the tune and benchmarks that table.
  table=${TABLE:-}
  if [ -z "$table" ]; then
    start=$(date +%s) table=.devrun/f
    timeout -s INT "${TUNE_LIMIT:-480}" python3 -m lzsolve tune --model llama3-70b --tp 8 --dtype fp8 --device cuda \
      --grid "${GRID:-small}" --trials "${TRIALS:-6}" \
      --kernels 'triton.linear_fp8*,triton.scaled_mm_fp8*,torch.scaled_mm*,triton.rms_norm*fp8*,triton.swiglu_fp8*' \
      --out "$table" 2> "$OUT/tune.err" | tee "$OUT/tune.out" | tail -12
    echo "tune rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s"; tail -3 "$OUT/tune.err"
    cp "$table"/dispatch.json "$table"/report.md "$OUT/" 2>/dev/null
    tar czf "$OUT/perfdb.tgz" -C "$table" perfdb
  fi
  if [ "${BENCH:-0}" = 1 ]; then
    python3 benchmarks/fp8.py --no-decode --pairs ${FP8_ARGS-} --table "$table" --json "$OUT/fp8.json" > "$OUT/fp8.txt" \
      2> "$OUT/fp8.err" || tail -8 "$OUT/fp8.err"
  fi
}

case "$stage" in
  setup) setup > "$OUT/setup.txt"; cat "$OUT/setup.txt" ;;
  session) session ;;
  cute) cute ;;
  parity|tune|families|suite|decisions|e2e|e2e_gpus|batch|launch|moe|flashinfer_moe|qwen35|hardening|jit|devices|fp8|fp8_tune)
    setup > "$OUT/setup.txt"
    "$stage" ;;
  *) echo "unknown stage '$stage': setup, session, parity, tune, families, suite, decisions, e2e, e2e_gpus, launch,"\
       "batch, cute, moe, flashinfer_moe, qwen35, hardening, jit, devices, fp8, fp8_tune (benchmarks/device.sh's top says what each runs)"
     exit 2 ;;
esac
