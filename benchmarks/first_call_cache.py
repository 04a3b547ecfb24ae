"""A kernel's first call in fresh worker processes that share one set of JIT caches, as a tune's
workers share its run's (lzsolve.jit.point_caches): the first process compiles cold, the next ones
read the caches the first wrote. benchmark log §15.5 (why lzsolve/measure/ahead.py warms Inductor's kernels).
With several workloads (--dims), each is a first call of its own in every process: what a kernel
that compiles per shape (flex.attention) costs per new shape, cold and from the shared caches.

    python benchmarks/first_call_cache.py --kernel compile.rms_norm --processes 3
    python benchmarks/first_call_cache.py --kernel flex.attention --op attention.prefill --static hq=8,hkv=1,d=128 \
        --flags causal --dtype bf16 --device cuda --dims "batch=1,seq=128;batch=2,seq=512;batch=1,seq=2048"
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cpu_modes import pairs

from lzsolve.measure.tasks import ParityTask
from lzsolve.measure.worker import WorkerRunner, share_bytecode
from runtime_loader.jit import point_caches
from runtime_loader.ops import OPS, Signature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="compile.rms_norm")
    parser.add_argument("--op", default="norm.rms")
    parser.add_argument("--static", default="hidden=256", help="the signature's static dims, name=value,...")
    parser.add_argument("--dims", default="tokens=4",
                        help="the workloads, each name=value,... and separated by ';': a first call each")
    parser.add_argument("--flags", default="", help="the signature's flags, comma-separated")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--own-bytecode", action="store_true",
                        help="no shared bytecode cache: each worker compiles what it imports, if the interpreter "
                             "has no bytecode for torch (as before share_bytecode)")
    args = parser.parse_args()
    static = pairs(args.static)
    sig = Signature.make(args.op, static, [f for f in args.flags.split(",") if f], args.dtype)
    workloads = [pairs(item) for item in args.dims.split(";") if item]
    root = Path(tempfile.mkdtemp(prefix="lzsolve-first-call-"))
    point_caches(root)  # cold, and inherited by every worker
    shared = not args.own_bytecode and share_bytecode(root / "bytecode")  # as tune does
    print(f"bytecode: {'one cache for the workers' if shared else 'as the interpreter has it'}")
    print(f"{args.kernel} on {sig}, {args.device}: first call per fresh worker process, caches shared")
    for n in range(args.processes):
        runner = WorkerRunner(torch.device(args.device))
        try:  # the worker's own start (imports, device) first, then the kernel's first call per workload
            runner.run(ParityTask(sig, OPS[args.op].fallback, workloads[0], 1))
            seconds, first_calls_ms = [], []  # each workload's parity task; its kernel's first call alone
            for dims in workloads:
                started = time.perf_counter()
                result = runner.run(ParityTask(sig, args.kernel, dims, 1))
                seconds.append(time.perf_counter() - started)
                first_calls_ms.append(result.get("jit_ms") or 0.0)
                if result.get("reason_code"):
                    print(f"  {dims}: {result['reason_code']} {result['reason_message']}"[:200])
            rest = (f", then {statistics.median(seconds[1:]):.2f} s per workload (first call "
                    f"{statistics.median(first_calls_ms[1:]) / 1e3:.2f} s; median of {len(seconds) - 1})"
                    if len(seconds) > 1 else "")
            print(f"  process {n + 1}: first {seconds[0]:.1f} s (first call {first_calls_ms[0] / 1e3:.1f} s){rest}")
        finally:
            runner.close()


if __name__ == "__main__":
    main()
