"""Does a restored artifact spare the server its JIT on the first request?

Runs two fresh processes against an artifact, each with empty default caches:
  cold:     load(path), then the first call of every table entry (JIT happens here)
  restored: load(path, restore_jit=True, warmup=True), then the same first calls
  lazy:     load(path, restore_jit=True), then the same first calls (libraries import on them)
and prints the load time, the first-request time (summed over entries) and
Inductor's cache hits and misses for each.

    python benchmarks/jit_restore.py ARTIFACT [--modes cold,restored] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

CHILD = """
import itertools, json, sys, time, torch
import runtime_loader
from runtime_loader import jit
from runtime_loader.ops import example_args
from runtime_loader.table import choose
from torch._dynamo.utils import counters
restore, warmup = sys.argv[2] != "cold", sys.argv[2] == "restored"
start = time.perf_counter()
d = runtime_loader.load(sys.argv[1], strict=True, restore_jit=restore, warmup=warmup, jit_dir=sys.argv[3])
load_s = time.perf_counter() - start
loaded_at = time.time()
device = torch.device("cuda" if d.device_type == "cuda" else "cpu")
first_ms, graphs, slowest = [], counters["stats"]["unique_graphs"], {}
for sig, tree in d.table.trees.items():
    grid = d.table.raw["buckets"][sig.op]
    dims = dict(zip(grid, (values[0] for values in grid.values())))
    args = example_args(sig, dims, device)
    method = getattr(d, d.METHODS[sig.op])
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    method(*args)
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_ms.append((time.perf_counter() - t) * 1e3)
    slowest[f"{sig} {choose(tree, dims)}"] = round(first_ms[-1], 1)
written = jit.written_since(jit.JIT_CACHES, loaded_at)  # on the first request: what was compiled anew
print(json.dumps({"load_s": load_s, "first_request_ms": sum(first_ms), "worst_entry_ms": max(first_ms),
                  "compiled_on_request": counters["stats"]["unique_graphs"] - graphs,
                  "fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
                  "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
                  "written_on_request": {k: sum(f.startswith(k + "/") for f in written) for k in jit.JIT_CACHES},
                  "written_files": [f for f in written if not f.startswith("flashinfer/")][:8]
                                   + [f for f in written if f.startswith("flashinfer/")][:3],
                  "slowest_entries": dict(sorted(slowest.items(), key=lambda kv: -kv[1])[:3])}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--modes", default="cold,restored",
                        help="which processes to run (cold, restored, lazy), comma-separated (a cold one JIT-compiles every kernel: minutes)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = {}
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as empty:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{empty}/inductor", "TRITON_CACHE_DIR": f"{empty}/triton"}
            out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), args.artifact, mode, f"{empty}/jit"],
                                 capture_output=True, text=True, env=env, check=True)
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'':9} {'load s':>7} {'first request ms':>17} {'worst entry ms':>15} {'compiled':>9} {'fx hit':>7} {'fx miss':>8}")
    for mode, r in results.items():
        print(f"{mode:9} {r['load_s']:7.2f} {r['first_request_ms']:17.1f} {r['worst_entry_ms']:15.1f} "
              f"{r['compiled_on_request']:9d} {r['fxgraph_hit']:7d} {r['fxgraph_miss']:8d}  "
              f"files compiled on the request: {r['written_on_request']} {r['written_files']}; "
              f"slowest: {r['slowest_entries']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
