"""A kernel's first call in fresh worker processes that share one set of JIT caches, as a tune's
workers share its run's (lzsolve.jit.point_caches): the first process compiles cold, the next ones
read the caches the first wrote. BENCHMARKS §15.5 (why lzsolve/ahead.py warms Inductor's kernels).

    python benchmarks/first_call_cache.py --kernel compile.rms_norm --processes 3
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from cpu_modes import pairs
from lzsolve.measure import ParityTask
from lzsolve.worker import WorkerRunner, share_bytecode
from runtime_loader.jit import point_caches
from runtime_loader.ops import OPS, Signature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="compile.rms_norm")
    parser.add_argument("--op", default="norm.rms")
    parser.add_argument("--static", default="hidden=256", help="the signature's static dims, name=value,...")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--own-bytecode", action="store_true",
                        help="no shared bytecode cache: each worker compiles what it imports, if the interpreter "
                             "has no bytecode for torch (as before share_bytecode)")
    args = parser.parse_args()
    static = pairs(args.static)
    sig = Signature.make(args.op, static, (), "fp32")
    root = Path(tempfile.mkdtemp(prefix="lzsolve-first-call-"))
    point_caches(root)  # cold, and inherited by every worker
    shared = not args.own_bytecode and share_bytecode(root / "bytecode")  # as tune does
    print(f"bytecode: {'one cache for the workers' if shared else 'as the interpreter has it'}")
    print(f"{args.kernel} on {sig}, {args.device}: first call per fresh worker process, caches shared")
    for n in range(args.processes):
        runner = WorkerRunner(torch.device(args.device))
        try:  # the worker's own start (imports, device) first, then the kernel's first call alone
            runner.run(ParityTask(sig, OPS[args.op].fallback, {"tokens": args.tokens}, 1))
            started = time.perf_counter()
            result = runner.run(ParityTask(sig, args.kernel, {"tokens": args.tokens}, 1))
            print(f"  process {n + 1}: {time.perf_counter() - started:.1f} s (jit_ms {result.get('jit_ms'):.0f})")
        finally:
            runner.close()


if __name__ == "__main__":
    main()
