"""Does the harness agree with triton.testing.do_bench, and does it reproduce the anchors?

Times the same calls three ways: do_bench (median, warmup=25 ms, rep=100 ms, L2
flushed before each call: the method of ../shared/anchors), and lzsolve's
harness in eager mode (back-to-back launches over rotated input sets, L2
flushed per sample) and graph mode (CUDA-graph replay of the same calls).
The two alternate for ROUNDS rounds and each reports its median over the rounds,
so clock and power drift (large GEMMs hit the power cap) falls on both alike.
Prints a table and writes the numbers as JSON.

    python benchmarks/harness_agreement.py --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import statistics

import torch
import triton
from triton.testing import do_bench

from lzsolve.measure.harness import CudaHarness, rotation_sets
from lzsolve.measure.tasks import tensor_bytes
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.hardware import hardware_signature
from runtime_loader.ops import Signature

ROUNDS = 3
HEADS = {"hq": 64, "hkv": 8, "d": 128}
# (label, op, static, flags, dims, kernel, anchor ms from ../shared/anchors/README.md)
CASES = [
    ("prefill b1 s512", "attention.prefill", HEADS, ("causal",), {"batch": 1, "seq": 512}, "sdpa.default", 0.0252),
    ("prefill b1 s2048", "attention.prefill", HEADS, ("causal",), {"batch": 1, "seq": 2048}, "sdpa.default", 0.1469),
    ("prefill b1 s8192", "attention.prefill", HEADS, ("causal",), {"batch": 1, "seq": 8192}, "sdpa.default", 1.947),
    ("prefill b1 s8192 cudnn", "attention.prefill", HEADS, ("causal",), {"batch": 1, "seq": 8192}, "sdpa.cudnn", 2.175),
    ("prefill b1 s8192 flash", "attention.prefill", HEADS, ("causal",), {"batch": 1, "seq": 8192}, "sdpa.flash", 3.265),
    ("prefill b8 s1024", "attention.prefill", HEADS, ("causal",), {"batch": 8, "seq": 1024}, "sdpa.default", 0.3208),
    ("decode b1 kv4096", "attention.decode", HEADS, (), {"batch": 1, "kv_len": 4096}, "sdpa.default", 0.0191),
    ("decode b32 kv4096", "attention.decode", HEADS, (), {"batch": 32, "kv_len": 4096}, "sdpa.default", 0.1908),
    ("rms 8192 t4096", "norm.rms", {"hidden": 8192}, (), {"tokens": 4096}, "torch.rms_norm", 0.0750),
    ("rms 8192 t16384", "norm.rms", {"hidden": 8192}, (), {"tokens": 16384}, "torch.rms_norm", 0.2768),
    ("qkv 8192->1280 M2048", "linear", {"k": 8192, "n": 1280}, (), {"tokens": 2048}, "torch.linear", 0.0588),
    ("gate_up 8192->7168 M2048", "linear", {"k": 8192, "n": 7168}, (), {"tokens": 2048}, "torch.linear", 0.3176),
    ("down 3584->8192 M2048", "linear", {"k": 3584, "n": 8192}, (), {"tokens": 2048}, "torch.linear", 0.1632),
    ("gate_up 8192->7168 M1", "linear", {"k": 8192, "n": 7168}, (), {"tokens": 1}, "torch.linear", 0.0568),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    device = torch.device("cuda")
    harness = CudaHarness(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for label, op, static, flags, dims, kernel_id, anchor in CASES:
        sig = Signature.make(op, static, flags, "bf16")
        contract, spec = CONTRACTS[op], registry.get(kernel_id)
        inputs = contract.make_inputs(sig, dims, device, gen)
        fn = functools.partial(spec.impl, *inputs)
        sets = rotation_sets(tensor_bytes(inputs), harness.cache_bytes, harness.budget)
        calls = [fn] + [functools.partial(spec.impl, *contract.make_inputs(sig, dims, device, gen))
                        for _ in range(sets - 1)]
        refs, eager, graph = [], [], []
        for _ in range(ROUNDS):
            refs.append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            m = harness.measure({kernel_id: calls})[kernel_id]
            eager.append(m.eager.median_ms)
            if m.graph:
                graph.append(m.graph.median_ms)
        rows.append({"case": label, "kernel": kernel_id, "anchor_ms": anchor, "do_bench_ms": statistics.median(refs),
                     "eager_ms": statistics.median(eager), "graph_ms": statistics.median(graph) if graph else None,
                     "rounds": {"do_bench": refs, "eager": eager, "graph": graph}, "sets": m.sets})
        del inputs, calls, fn
        torch.cuda.empty_cache()

    print(f"{'case':26} {'kernel':15} {'anchor':>8} {'do_bench':>9} {'eager':>9} {'graph':>9} "
          f"{'eager/db':>8} {'graph/db':>8} {'db/anchor':>9}")
    for r in rows:
        g = r["graph_ms"]
        print(f"{r['case']:26} {r['kernel']:15} {r['anchor_ms']:8.4f} {r['do_bench_ms']:9.4f} {r['eager_ms']:9.4f} "
              f"{g if g else float('nan'):9.4f} {r['eager_ms'] / r['do_bench_ms']:8.3f} "
              f"{(g / r['do_bench_ms']) if g else float('nan'):8.3f} {r['do_bench_ms'] / r['anchor_ms']:9.3f}")
    within = [r for r in rows if abs(r["eager_ms"] / r["do_bench_ms"] - 1) <= 0.05]
    within_graph = [r for r in rows if r["graph_ms"] and abs(r["graph_ms"] / r["do_bench_ms"] - 1) <= 0.05]
    print(f"eager within 5% of do_bench: {len(within)}/{len(rows)}; graph within 5%: {len(within_graph)}/{len(rows)}; "
          f"median do_bench/anchor {statistics.median(r['do_bench_ms'] / r['anchor_ms'] for r in rows):.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.date.today().isoformat(), "hardware": hardware_signature(device),
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
