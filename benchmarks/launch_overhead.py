"""Host time of one launch: a torch op against a Triton kernel, launched through its JIT function
(what lzsolve's Triton ops do today) and through the compiled kernel directly.

BENCHMARKS §11.4 found the eager prefill rows host-bound: the table's Python dispatch plus Triton's
Python launcher cost about as much host time as the eager ops they replace. This measures the
launcher's part on small inputs, where the host sets the pace: N back-to-back calls per round,
interleaved rounds, median µs per call. The compiled kernel's own launcher skips the JIT
function's argument binding and specialisation (a caller that did this would have to know the
specialisation still holds, e.g. from shapes and strides it binds once); its output is checked
against the JIT launch's.

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


def check_keys() -> list[str]:
    """Over argument variations of the RMSNorm kernel (alignment, a residual or none, ints that are
    1, multiples of 16 or neither, one past 32 bits), whether equal prototype keys always meet the
    same compiled kernel that Triton's own binder picks (compiled, not launched: warmup=True)."""
    base = torch.randn(3 * 8192 + 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)

    def tensor(offset: int):  # offset in elements: 1 moves the pointer 2 bytes off 16-byte alignment
        return base[offset:offset + 8192]

    variations = []
    for x_off in (0, 8, 1):
        for res in (None, 0, 3):
            for n_cols in (8192, 8191, 1):
                for stride in (8192, 8200, 2**31 + 16):
                    variations.append((x_off, res, n_cols, stride))
    seen: dict = {}
    problems = []
    for x_off, res_off, n_cols, stride in variations:
        x, out = tensor(x_off), tensor(16)
        res = None if res_off is None else tensor(res_off)
        pos = (x, res, w, out, stride, 1, stride if res is not None else 0, 1, 1, stride, 1, n_cols, 1e-6)
        kw = dict(BLOCK=8192, ONE_TILE=n_cols <= 8192, UNIT_OFFSET=False, num_warps=16)
        key = (tuple(map(spec_key, pos)), tuple(kw.items()))
        kernel = _rms_norm_kernel.run(*pos, grid=(1,), warmup=True, **kw)
        if key in seen and seen[key] is not kernel:
            problems.append(f"one key, two kernels: x offset {x_off}, res {res_off}, n_cols {n_cols}, stride {stride}")
        seen.setdefault(key, kernel)
    kernels = len({id(k) for k in seen.values()})
    print(f"  key check: {len(variations)} variations, {len(seen)} prototype keys, {kernels} Triton kernels, "
          f"{len(problems)} keys meeting two kernels")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--check-keys", action="store_true", help="also check the prototype key against Triton's")
    parser.add_argument("--json")
    args = parser.parse_args()
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(args.hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    out = torch.empty_like(x)
    block = 8192
    # the kernel's arguments in its signature's order, constexprs included (the launcher skips them)
    kernel_args = (x, res, w, out, *x.stride(), *res.stride(), w.stride(0), *out.stride(), args.hidden, 1e-6,
                   block, args.hidden <= block, False)

    def jit_launch():
        _rms_norm_kernel[(args.tokens,)](*kernel_args[:-3], BLOCK=block, ONE_TILE=args.hidden <= block,
                                         UNIT_OFFSET=False, num_warps=16)

    # the kernel writes x + res back into res (rms_norm_add's in-place form): each check starts from a copy
    res_before = res.clone()
    jit_launch()
    expected = out.clone()
    res.copy_(res_before)
    variants = {
        "torch.add": lambda: torch.add(x, res),
        "torch.empty_like": lambda: torch.empty_like(x),
        "F.rms_norm": lambda: F.rms_norm(x, (args.hidden,), w, 1e-6),
        "triton JIT launch": jit_launch,
    }
    try:  # Triton's internals: the JIT function's cache of compiled kernels for this device
        compiled = next(iter(_rms_norm_kernel.device_caches[torch.cuda.current_device()][0].values()))
        runner = compiled[(args.tokens, 1, 1)]
        out.zero_()
        runner(*kernel_args)
        direct_ok = torch.equal(out, expected)
        res.copy_(res_before)
        variants["triton compiled launch"] = lambda: runner(*kernel_args)
        positional, options = kernel_args[:-3], dict(BLOCK=block, ONE_TILE=args.hidden <= block, UNIT_OFFSET=False,
                                                     num_warps=16)
        constexprs, cache = kernel_args[-3:], {}

        def keyed_launch():  # the prototype: key, dict read, then the compiled kernel's launcher
            key = (torch.cuda.current_device(), tuple(map(spec_key, positional)), tuple(options.items()))
            kernel = cache.get(key)
            if kernel is None:
                cache[key] = _rms_norm_kernel.run(*positional, grid=(args.tokens,), warmup=False, **options)
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
        print(f"  {name:<24} {row['median_us']:7.2f}  (min {row['min_us']:.2f})")
    print(f"  compiled launch gives the JIT launch's output: {direct_ok}")
    problems = check_keys() if args.check_keys else []
    print("\n".join(problems))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "date": str(dt.date.today()), "rows": rows,
                       "compiled_output_equal": direct_ok, "key_problems": problems}, f, indent=1)


if __name__ == "__main__":
    main()
