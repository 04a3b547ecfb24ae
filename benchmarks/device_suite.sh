#!/usr/bin/env bash
# BENCHMARKS.md §9 on the lent H100, in stages that fit one device call each (STAGE=...):
#   tune:   tuning_throughput.py (llama3-70b TP8, default grid, cold then warm) into .devrun/suite,
#           then the artifact comes back as $OUT/suite.tgz.* (carry those parts to the next stages,
#           which unpack them: .devrun/suite holds ~72 MB of JIT caches, over what a call carries);
#   layer:  decoder_layer.py on that artifact;
#   quality: decision_quality.py (lzsolve evaluate) on it, and replay_overhead.py;
#   ci:     ci/tune_artifacts.py twice on llama3-8b (tiny grid), the second run gated on the first.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
if [ "${STAGE:?set STAGE=tune|layer|quality|ci}" != tune ] && ls .devrun/parts/suite.tgz.* > /dev/null 2>&1; then cat .devrun/parts/suite.tgz.* | tar xz; fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$OUT/setup.txt"
case "${STAGE:?set STAGE=tune|layer|quality}" in
  tune)
    python3 benchmarks/tuning_throughput.py --model llama3-70b --tp 8 --out .devrun/suite --json "$OUT/tuning.json" \
      -- --device cuda --trials "${TRIALS:-0}" 2> "$OUT/tune.err"
    echo "tune rc=$?"; tail -2 "$OUT/tune.err"
    # the artifact with its JIT caches, in parts under the 16 MiB a returned file may have
    # (cat suite.tgz.* | tar xz; the next stages carry the parts, not the ~80 MB folder)
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
esac
