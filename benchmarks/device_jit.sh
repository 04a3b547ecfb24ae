#!/usr/bin/env bash
# Issue 17's JIT figures on the H100: a cold llama3-70b TP8 tune (small grid, no search: one
# device call), the size of its JIT archive (only the files the chosen kernels' first calls
# wrote) against packing the same run's caches whole (what artifacts held before), and the load
# time of fresh processes with restore_jit, with and without warm-up (benchmarks/jit_restore.py).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
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
