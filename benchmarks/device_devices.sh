#!/usr/bin/env bash
# BENCHMARKS.md §15 (issue 16) on a lent two-GPU machine: one tune on every GPU of the host
# (`--devices all`) against the same tune on one of them, each cold (its own PerfDB, optuna
# studies and JIT caches), then whether the two tables agree (benchmarks/tune_agreement.py).
#   STAGE=two  the two-GPU tune; brings back $OUT/two.tgz (carry it as .devrun/parts/two.tgz)
#   STAGE=one  the one-GPU tune (cuda:0), then the agreement with the carried two-GPU artifact
# GRID and TRIALS set the grid and the optuna trials per bucket (both runs the same).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
nvidia-smi -L
args=(--model llama3-70b --tp 8 --grid "${GRID:-small}" --trials "${TRIALS:-4}" --json)
tune() {  # name, then the device option
  local start; start=$(date +%s)
  timeout -s INT "${LIMIT:-560}" python3 -m lzsolve tune "${args[@]}" "${@:2}" --out "/tmp/$1" > "$OUT/$1.json" 2> "$OUT/$1.err"
  echo "$1: rc=$? wall=$(( $(date +%s) - start )) s"; grep -E "^search:|^wrote|error" "$OUT/$1.err" | tail -3
  tar cz -C /tmp "$1/dispatch.json" "$1/report.md" "$1/perfdb" > "$OUT/$1.tgz"; ls -la "$OUT/$1.tgz"
}
if [ "${STAGE:-two}" = two ]; then
  tune two --devices all
else
  tune one --device cuda:0
  tar xzf .devrun/parts/two.tgz -C /tmp && \
    python3 benchmarks/tune_agreement.py compare /tmp/one /tmp/two --mode graph --json "$OUT/agreement.json"
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        s = json.loads(f.read_text())
    except ValueError:
        continue
    if "phases" in s:
        print(f"{f.stem}: wall {s['wall_s']} s, phases {s['phases']}, measured {s['measured']}, "
              f"search {s['search'] and s['search']['trials_run']} trials")
PY
