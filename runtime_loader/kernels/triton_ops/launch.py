"""Our Triton kernels launched with less host work than `kernel[grid](...)` takes.

Triton's JIT function binds, specialises and keys every call in Python before it reaches the
compiled kernel's launcher: 23-31 us of host time per launch on the H100's host, against 11-15 us
for the compiled kernel launched directly and 9-13 us for one ATen op (benchmarks/launch_overhead.py). In an
eager model that host time decides the speed (benchmarks/hf_end_to_end.py), so a kernel that saves GPU time could lose it
again on the host.

`launcher` wraps a top-level kernel (`@launcher` over `@triton.jit`; call sites keep `[grid](...)`).
Its first call with a given key goes through Triton's JIT function, which compiles (or finds) and
launches the kernel and returns it; later calls with that key launch the compiled kernel directly,
as Triton's own `CompiledKernel.__getitem__` runner does. The key must be at least as fine as
Triton's specialisation, or a call would run a kernel specialised for other arguments: it holds
the current device, each tensor's dtype and pointer modulo 16 (Triton specialises on 16-byte
alignment), every other argument by type and value (exact ints are finer than Triton's classes:
equal to 1, a multiple of 16, 32 or 64 bits), and the keyword options (constexprs, num_warps).
A shape-fixed call site (a dispatcher key's shapes fix every int and stride) meets one key, so the
per-call work left is the key itself and the launch.

Under torch.compile the kernel is Triton's JIT function, which Dynamo knows how to put in a graph
(tracing into the key and the launch failed, on symbolic ints and on the compiled kernel).

Calls the fast path cannot replay exactly fall back to the JIT function every time: a callable
grid, constexprs passed by position, a constexpr argument without a keyword, a function that is
not a JITFunction (the interpreter's, under TRITON_INTERPRET=1), or a Triton before 3.4.
LZSOLVE_TRITON_LAUNCH=jit sends every call there (a way out should a Triton release change its
compiled kernels' launcher).
"""
from __future__ import annotations

import functools
import inspect
import os

import torch
from triton.runtime import driver

try:  # Triton 3.4+: the compiled kernel's launcher as replayed here takes its hooks from knobs
    from triton import knobs
    from triton.runtime.jit import JITFunction
except ImportError:  # an older Triton launches with other arguments: every call goes through its JIT function
    knobs = JITFunction = None

Tensor = torch.Tensor
MAX_KEYS = 4096  # keys per kernel before the cache starts again: exact ints could grow it without bound
DIRECT = os.environ.get("LZSOLVE_TRITON_LAUNCH", "direct") != "jit"  # read per call: a benchmark may flip it
JIT_ONLY = object()  # a key whose calls the fast path cannot replay (see _constexpr_tail)


def _arg_key(args: tuple) -> list:
    # ints first (most arguments are strides and sizes); (type, value) for the rest, since True == 1
    # == 1.0 in a dict while Triton types them i1, i32 and fp32
    return [a if a.__class__ is int else (a.dtype, a.data_ptr() & 15) if isinstance(a, Tensor) else (a.__class__, a)
            for a in args]


class Launcher:
    """A @triton.jit kernel whose launches, after the first of each key, skip the JIT function."""

    def __init__(self, fn):
        self.fn = fn  # the JIT function: Triton's own API (run, warmup, device caches) stays reachable
        self.fast = JITFunction is not None and isinstance(fn, JITFunction)
        self._bound: dict[tuple, tuple] = {}  # key -> (compiled kernel, constexpr values in signature order)

    def __repr__(self) -> str:
        return f"launcher({self.fn!r})"

    def __getitem__(self, grid):
        if torch.compiler.is_compiling():  # Dynamo traces Triton's JIT function into its graph, not our cache
            return self.fn[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **options):
        if not (self.fast and DIRECT) or callable(grid):
            return self.fn[grid](*args, **options)
        device = driver.active.get_current_device()
        key = (device, *_arg_key(args), *options.items())
        bound = self._bound.get(key)
        if bound is None:
            return self._bind(key, grid, args, options)
        if bound is JIT_ONLY:
            return self.fn[grid](*args, **options)
        kernel, tail = bound
        stream = driver.active.get_current_stream(device)
        values = (*args, *tail)  # every parameter in the signature's order, as Triton's bound arguments
        size = len(grid)
        hooks = knobs.runtime
        kernel.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, kernel.launch_metadata(grid, stream, *values), hooks.launch_enter_hook,
                   hooks.launch_exit_hook, *values)
        return kernel

    def _bind(self, key: tuple, grid, args: tuple, options: dict):
        """The key's first call: Triton launches it (compiling if it must) and gives the kernel."""
        kernel = self.fn.run(*args, grid=grid, warmup=False, **options)
        tail = self._constexpr_tail(len(args), options)
        if len(self._bound) >= MAX_KEYS:
            self._bound.clear()
        self._bound[key] = JIT_ONLY if tail is None else (kernel, tail)
        return kernel

    def _constexpr_tail(self, positional: int, options: dict) -> tuple | None:
        """The values of the parameters after the positional ones, which must all be constexprs given
        by keyword or by default; None where the call does not have that form."""
        params = self.fn.params
        if any(p.is_constexpr for p in params[:positional]):
            return None
        tail = []
        for param in params[positional:]:
            if not param.is_constexpr:
                return None
            default = self.fn.signature.parameters[param.name].default
            if param.name not in options and default is inspect.Parameter.empty:
                return None
            tail.append(options.get(param.name, default))
        return tuple(tail)


def launcher(fn) -> Launcher:
    """Decorate a top-level @triton.jit kernel (one launched from Python, never called by another
    kernel) so that its launches take the fast path above."""
    return Launcher(fn)
