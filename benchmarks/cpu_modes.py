"""Does a CPU kernel's time hold from one timing task to the next? (issue 12, benchmark log §10.15)

Times the given kernels of one op signature at one point in N timing tasks in one process, as a
tune would (lzsolve's CPU harness, the tune's budget, inputs allocated anew for each task) and
prints each task's medians: a kernel whose time has modes shows them here. --calls N then
replays each kernel N times back to back after the tasks, as a server would, and times that. --offsets instead places the
first two inputs in one buffer at gaps of 0 .. 4096 bytes and times every kernel at each gap
(whether a kernel's mode follows where its operands lie relative to each other, mod 4 KiB).

    python benchmarks/cpu_modes.py --op norm.rms_add --static hidden=8192 --dims tokens=60 \
        --kernels eager.rms_norm_add,torch.rms_norm_add,compile.rms_norm_add --tasks 8
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from lzsolve.measure.harness import CPU_PLACEMENTS, Budget, CpuHarness
from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.ops import Signature


def pairs(text: str) -> dict:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


def back_to_back_us(call, calls: int) -> float:
    """Median us of `calls` calls in a bare loop, after one untimed call."""
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def by_offset(contract, sig, dims, kernels, calls: int) -> None:
    """Median us per kernel with the second input placed `gap` bytes after the end of the first."""
    x, second, *rest = contract.make_inputs(sig, dims, torch.device("cpu"), torch.Generator().manual_seed(0))
    n, item = x.numel(), x.element_size()
    buffer = torch.empty(2 * n + 8192 // item, dtype=x.dtype)
    print(f"{sig} {dims}: median us of {calls} calls; gap = bytes between the end of input 0 and input 1")
    print("gap  " + " ".join(f"{k:>22}" for k in kernels))
    for gap in range(0, 4097, 256):
        start = n + gap // item
        a, b = buffer[:n].view(x.shape), buffer[start:start + n].view(second.shape)
        row = []
        for k in kernels:
            a.copy_(x)
            b.copy_(second)
            row.append(back_to_back_us(functools.partial(registry.get(k).impl, a, b, *rest), calls))
        print(f"{gap:>4} " + " ".join(f"{t:>22.0f}" for t in row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="norm.rms_add")
    parser.add_argument("--static", default="hidden=8192", help="the signature's static dims, k=v,...")
    parser.add_argument("--flags", default="", help="the signature's flags, comma-separated")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--dims", default="tokens=60", help="the point, k=v,...")
    parser.add_argument("--kernels", default="eager.rms_norm_add,torch.rms_norm_add,compile.rms_norm_add")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--calls", type=int, default=2000, help="then this many calls per kernel back to back")
    parser.add_argument("--offsets", action="store_true", help="time each kernel with its first two inputs "
                        "at gaps of 0 .. 4096 bytes in one buffer instead")
    args = parser.parse_args()
    sig = Signature.make(args.op, pairs(args.static), tuple(f for f in args.flags.split(",") if f), args.dtype)
    dims, kernels = pairs(args.dims), args.kernels.split(",")
    contract, cpu = CONTRACTS[sig.op], torch.device("cpu")
    if args.offsets:
        return by_offset(contract, sig, dims, kernels, args.calls)
    harness = CpuHarness(Budget(), CPU_PLACEMENTS)
    gen = torch.Generator().manual_seed(0)
    print(f"{sig} {dims}: torch threads {torch.get_num_threads()}; medians in us per task "
          f"({CPU_PLACEMENTS} rounds each, as the tune)")
    print("task " + " ".join(f"{k:>24}" for k in kernels))
    for task in range(args.tasks):
        row = {}
        for placement in range(harness.placements):
            inputs = [contract.make_inputs(sig, dims, cpu, gen) for _ in range(4)]
            order = kernels if placement % 2 == 0 else kernels[::-1]
            calls = {k: [functools.partial(registry.get(k).impl, *a) for a in inputs] for k in order}
            for k, m in harness.measure(calls, ("eager",)).items():
                row.setdefault(k, []).append(m.eager.median_ms * 1e3 if not isinstance(m, Exception) else float("nan"))
        print(f"{task:>4} " + " ".join(f"{'/'.join(f'{t:.0f}' for t in row[k]):>24}" for k in kernels))
    inputs = contract.make_inputs(sig, dims, cpu, gen)
    line = [f"{k} {back_to_back_us(functools.partial(registry.get(k).impl, *inputs), args.calls):.0f}"
            for k in kernels]
    print(f"{args.calls} calls back to back, median us: " + ", ".join(line))


if __name__ == "__main__":
    main()
