"""Where a kernel's first call in a fresh process goes when the run's JIT caches already hold it,
as in a tune's measuring worker after lzsolve.measure.ahead made that call in another process
(benchmark log §15.6: flex.attention's first call took 11-12 s per worker on two H200s).

Each kernel gets two fresh processes sharing one set of caches: the first makes the call cold
(filling the caches, as the ahead worker does), the second makes it again under cProfile and
prints where its time went, by cumulative time.

    python benchmarks/archive/first_call_profile.py --device cuda \\
        'flex.attention:attention.prefill:hq=8,hkv=1,d=128:causal:batch=1,seq=128' \\
        'liger.rms_norm:norm.rms:hidden=8192::tokens=16'
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for cpu_modes (this script is in archive/)
from cpu_modes import pairs

from lzsolve.ops import CONTRACTS
from runtime_loader import registry
from runtime_loader.jit import point_caches
from runtime_loader.ops import OPS, Signature


def parse(case: str) -> tuple[str, Signature, dict]:
    """'kernel:op:static:flags:dims' (static and dims as name=value,...; flags as a,b)."""
    kernel, op, static, flags, dims = case.split(":")
    return kernel, Signature.make(op, pairs(static), tuple(f for f in flags.split(",") if f), "bf16"), pairs(dims)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def child(case: str, device: torch.device, profile: bool) -> None:
    kernel, sig, dims = parse(case)
    inputs = CONTRACTS[sig.op].make_inputs(sig, dims, device, torch.Generator(device=device).manual_seed(0))
    registry.get(OPS[sig.op].fallback).impl(*inputs)  # the worker's own start: imports, the device
    sync(device)
    impl = registry.get(kernel).impl
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    impl(*inputs)
    sync(device)
    if profiler:
        profiler.disable()
    print(f"  {'warm caches' if profile else 'cold caches'}: {time.perf_counter() - started:.2f} s")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(28)
        print("\n".join(line[:160] for line in out.getvalue().splitlines()[6:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="kernel:op:static:flags:dims")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.cases[0], torch.device(args.device), args.profile)
        return
    for case in args.cases:
        parse(case)  # a bad case fails here, before any process starts
        point_caches(Path(tempfile.mkdtemp(prefix="lzsolve-first-call-")))  # inherited by both processes
        print(case, flush=True)
        for profile in (False, True):
            cmd = [sys.executable, __file__, case, "--device", args.device, "--child"] + ["--profile"] * profile
            subprocess.run(cmd, check=True, env=os.environ)


if __name__ == "__main__":
    main()
