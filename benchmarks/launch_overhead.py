"""Host time of one launch: a torch op against a Triton kernel launched through its JIT function,
through lzsolve's launcher (runtime_loader/kernels/triton_ops/launch.py, what our ops do since
benchmark log §11.7) and through the compiled kernel directly; then the whole norm.rms_add op, eager
against our Triton op.

benchmark log §11.4 found the eager prefill rows host-bound: the table's Python dispatch plus Triton's
Python launcher cost about as much host time as the eager ops they replace. This measures the
launcher's part on small inputs, where the host sets the pace: N back-to-back calls per round,
interleaved rounds, median µs per call. The compiled kernel's own launcher skips the JIT
function's argument binding and specialisation; the launcher keeps one compiled kernel per key of
the arguments (§11.6's prototype computed such a key generically, per argument). Each fast path's
output is checked against the JIT launch's.

    python benchmarks/launch_overhead.py --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time

import torch
import torch.nn.functional as F

from runtime_loader import registry
from runtime_loader.kernels.triton_ops.norm import _rms_norm_kernel


def per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def spec_key(arg) -> object:
    """A prototype launch key for one argument, meant to be at least as fine as Triton's
    specialisation: a tensor's dtype and 16-byte alignment; for an int whether it is 1, a multiple
    of 16, and which of i32 / i64 / u64 holds it; a float's type; anything else by value."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, bool):
        return bool, arg
    if isinstance(arg, int):
        return int, arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31, -2**63 <= arg < 2**63
    if isinstance(arg, float):
        return float
    return type(arg), arg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(args.hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    out = torch.empty_like(x)
    block = 8192
    # the kernel's arguments in its signature's order, constexprs included (the launcher skips them)
    # (the total goes into res's storage: rms_norm_add's in-place form)
    kernel_args = (x, res, w, out, res, *x.stride(), *res.stride(), w.stride(0), *out.stride(), *res.stride(),
                   args.hidden, 1e-6, block, args.hidden <= block, False)

    options = dict(BLOCK=block, ONE_TILE=args.hidden <= block, UNIT_OFFSET=False, num_warps=16)
    positional, constexprs = kernel_args[:-3], kernel_args[-3:]

    def jit_launch():  # Triton's JIT function: what our ops did before the launcher
        _rms_norm_kernel.fn[(args.tokens,)](*positional, **options)

    def launcher_launch():
        _rms_norm_kernel[(args.tokens,)](*positional, **options)

    # the kernel writes x + res back into res (rms_norm_add's in-place form): each check starts from a copy
    res_before = res.clone()

    def output_of(launch) -> torch.Tensor:
        res.copy_(res_before)
        out.zero_()
        launch()
        launch()  # the launcher's second call of a key is its fast path
        res.copy_(res_before)
        launch()
        return out.clone()

    expected = output_of(jit_launch)
    launcher_ok = torch.equal(output_of(launcher_launch), expected)
    eager_add = registry.get("eager.rms_norm_add").impl
    triton_add = registry.get("triton.rms_norm_add").impl
    variants = {
        "torch.add": lambda: torch.add(x, res),
        "torch.empty_like": lambda: torch.empty_like(x),
        "F.rms_norm": lambda: F.rms_norm(x, (args.hidden,), w, 1e-6),
        "triton JIT launch": jit_launch,
        "lzsolve launcher": launcher_launch,
        # whole ops (in place: x and res change every call, which leaves the host's work as it is)
        "op eager.rms_norm_add": lambda: eager_add(x, res, w, 1e-6),
        "op triton.rms_norm_add": lambda: triton_add(x, res, w, 1e-6),
    }
    try:  # Triton's internals: the JIT function's cache of compiled kernels for this device
        compiled = next(iter(_rms_norm_kernel.fn.device_caches[torch.cuda.current_device()][0].values()))
        runner = compiled[(args.tokens, 1, 1)]
        direct_ok = torch.equal(output_of(lambda: runner(*kernel_args)), expected)
        variants["triton compiled launch"] = lambda: runner(*kernel_args)
        cache = {}

        def keyed_launch():  # §11.6's prototype: a key per argument, dict read, then the compiled kernel's launcher
            key = (torch.cuda.current_device(), tuple(map(spec_key, positional)), tuple(options.items()))
            kernel = cache.get(key)
            if kernel is None:
                cache[key] = _rms_norm_kernel.fn.run(*positional, grid=(args.tokens,), warmup=False, **options)
            else:
                kernel[(args.tokens, 1, 1)](*positional, *constexprs)

        variants["triton keyed compiled launch"] = keyed_launch
    except Exception as e:  # another Triton's layout: report it, time the rest
        direct_ok = f"not run: {type(e).__name__}: {e}"
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(per_call_us(fn, args.calls))
    rows = {name: {"median_us": statistics.median(t), "min_us": min(t)} for name, t in times.items()}
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}, triton {__import__('triton').__version__}, {dt.date.today()}; "
          f"host us per call (median of {args.rounds} rounds x {args.calls}), rms_norm {args.tokens}x{args.hidden}")
    for name, row in rows.items():
        print(f"  {name:<30} {row['median_us']:7.2f}  (min {row['min_us']:.2f})")
    print(f"  compiled launch gives the JIT launch's output: {direct_ok}; the launcher's: {launcher_ok}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "date": str(dt.date.today()), "rows": rows,
                       "compiled_output_equal": direct_ok, "launcher_output_equal": launcher_ok}, f, indent=1)


if __name__ == "__main__":
    main()
