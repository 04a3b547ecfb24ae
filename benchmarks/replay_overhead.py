"""Host-side cost of replaying a dispatch table: Dispatcher call vs direct call of the same kernel.

Builds a table whose trees route each op through a split to one kernel, then times,
interleaved over many rounds, N back-to-back calls made (a) directly to the kernel
and (b) through the Dispatcher, on small tensors where the host, not the device,
sets the pace. Also times the lookup alone. Prints medians per call and writes JSON.

    python benchmarks/replay_overhead.py --device cuda --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time

import torch

from lzsolve.store.artifact import kernel_provenance
from runtime_loader import Dispatcher, registry
from runtime_loader.hardware import hardware_signature
from runtime_loader.ops import OPS, Signature, example_args
from runtime_loader.table import parse_table

# (op, static, flags, dims, kernel the tree picks, Dispatcher method)
CASES = [
    ("norm.rms", {"hidden": 8192}, (), {"tokens": 1}, "torch.rms_norm", "rms_norm"),
    ("linear", {"k": 8192, "n": 1280}, (), {"tokens": 1}, "torch.linear", "linear"),
    ("act.swiglu", {"width": 3584}, (), {"tokens": 1}, "eager.swiglu", "swiglu"),
    ("posenc.rope", {"hq": 8, "hkv": 1, "d": 128, "layout": "split_half"}, (), {"tokens": 1}, "eager.rope", "rope"),
    ("attention.decode", {"hq": 8, "hkv": 1, "d": 128}, (), {"batch": 1, "kv_len": 512}, "sdpa.default", "attention"),
]
# On a CPU the kernel runs in the caller's thread, so its own time (330 us for the 8192 x 1280
# GEMM above) and its noise add to both sides of the difference; the dispatcher's work does not
# depend on the shapes, so there the kernels get small ones (a few us each) and fp32.
CPU_SHAPES = {"norm.rms": {"hidden": 256}, "linear": {"k": 256, "n": 128}, "act.swiglu": {"width": 256},
              "posenc.rope": {"hq": 2}, "attention.decode": {"hq": 2, "d": 64}}
CPU_DIMS = {"attention.decode": {"batch": 1, "kv_len": 64}}


def cases(device: torch.device) -> list[tuple]:
    if device.type == "cuda":
        return CASES
    return [(op, {**static, **CPU_SHAPES.get(op, {})}, flags, CPU_DIMS.get(op, dims), kernel_id, method)
            for op, static, flags, dims, kernel_id, method in CASES]


def table_for(device: torch.device, dtype: str) -> dict:
    ops = []
    for op, static, flags, dims, kernel_id, _ in cases(device):
        sig = Signature.make(op, static, flags, dtype)
        dim = next(iter(dims))
        # a real split, so the first call walks a tree; the replayed calls never do
        tree = {"dim": dim, "threshold": 1e9, "le": {"kernel_id": kernel_id}, "gt": {"kernel_id": sig.schema.fallback}}
        ops.append({"signature": str(sig), **sig.to_json(), "tree": tree})
    kernels = {k for *_, k, _ in CASES} | {Signature.make(op, s, f, dtype).schema.fallback
                                           for op, s, f, *_ in cases(device)}
    return {"schema_version": 1, "model": {"id": "bench", "tp": 1, "dtype": dtype},
            "hardware": hardware_signature(device), "capabilities_hash": registry.capabilities_hash(),
            "kernels": kernel_provenance(kernels), "timing_mode": "eager", "buckets": {},
            "fallback_policy": {"outside_table": "fallback", "fallbacks": {}}, "jit": None, "ops": ops}


def per_call_us(fn, n: int, sync) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", help="default: bf16 on cuda, fp32 on cpu")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    d = Dispatcher(parse_table(table_for(device, args.dtype)))
    rows = []
    for op, static, flags, dims, kernel_id, method in cases(device):
        sig = Signature.make(op, static, flags, args.dtype)
        call_args = example_args(sig, dims, device)
        direct = registry.get(kernel_id).impl
        dispatched = getattr(d, method)
        kernel_args = OPS[op].front(*call_args)[1]  # the plain call, without options left at their defaults
        assert d.kernel_for(method, *call_args) == kernel_id
        timings = {"direct": [], "dispatcher": [], "lookup": []}
        for _ in range(args.rounds):
            timings["direct"].append(per_call_us(lambda: direct(*kernel_args), args.calls, sync))
            timings["dispatcher"].append(per_call_us(lambda: dispatched(*call_args), args.calls, sync))
            timings["lookup"].append(per_call_us(lambda: d._entry(method, call_args, {}), args.calls, lambda: None))
        overhead = [b - a for a, b in zip(timings["direct"], timings["dispatcher"])]
        rows.append({"op": op, "kernel": kernel_id, **{k: statistics.median(v) for k, v in timings.items()},
                     "overhead_us": statistics.median(overhead)})
    print(f"{'op':18} {'kernel':15} {'direct us':>10} {'dispatcher us':>14} {'overhead us':>12} {'lookup us':>10}")
    for r in rows:
        print(f"{r['op']:18} {r['kernel']:15} {r['direct']:10.2f} {r['dispatcher']:14.2f} {r['overhead_us']:12.2f} "
              f"{r['lookup']:10.2f}")
    print(f"median overhead per call: {statistics.median(r['overhead_us'] for r in rows):.2f} us "
          f"(device {device}, {args.rounds} rounds x {args.calls} calls)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": dt.date.today().isoformat(), "device": str(device),
                       "hardware": hardware_signature(device), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
