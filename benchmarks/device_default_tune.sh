#!/usr/bin/env bash
# Issue 16 on the lent H100: the default `lzsolve tune --model llama3-70b --tp 8`, cold (a fresh
# --out: no PerfDB, optuna studies or JIT caches), with TUNE_ARGS added (e.g. the smarter search
# budget, --patience 4 --skip-behind 0.3), cut at TUNE_LIMIT seconds (SIGINT: the records so far
# are kept). Prints the wall time and the last progress lines of each phase; keeps the report,
# dispatch.json, the PerfDB and the progress log under $OUT.
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
start=$(date +%s)
timeout -s INT "${TUNE_LIMIT:-560}" python3 -m lzsolve tune --model llama3-70b --tp 8 --device cuda ${TUNE_ARGS-} \
  --out /tmp/default-tune > "$OUT/tune.out" 2> "$OUT/tune.err"
echo "tune rc=$? wall=$(( $(date +%s) - start ))s"
tr '\r' '\n' < "$OUT/tune.err" | grep -E "100%|^wrote|[Ii]nterrupt|Error" | tail -12
tr '\r' '\n' < "$OUT/tune.err" | tail -2
grep -E "^- (run|time per phase|search):" /tmp/default-tune/report.md 2>/dev/null
cp /tmp/default-tune/dispatch.json /tmp/default-tune/report.md "$OUT/" 2>/dev/null
tar czf "$OUT/perfdb.tgz" -C /tmp/default-tune perfdb 2>/dev/null
