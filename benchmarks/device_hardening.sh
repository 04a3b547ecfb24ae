#!/usr/bin/env bash
# Issue 17's H100 host figures: what a call's pieces cost in Python there and, in C++, the key
# (host_floor.py --cpp; HOST_FLOOR_ARGS= for Python alone), replay
# overhead (benchmarks/replay_overhead.py, twice; REPLAY_RUNS="1" for one) and the
# load time of the llama3-70b TP8 artifact in fresh processes (carried as .devrun/parts/d-lite.tgz,
# from benchmarks/device_decisions.sh: no JIT archive, so restore_jit has nothing to restore).
set -u
. benchmarks/device_setup.sh > "$OUT/setup.txt"
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
