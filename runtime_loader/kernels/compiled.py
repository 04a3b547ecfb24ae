"""torch.compile variants of the eager kernels (Inductor: Triton on CUDA, C++ on CPU).

One compiled graph serves every token count: the token dims are marked *unbacked*
when a graph is traced, so Inductor neither specialises on the first shape it sees
nor picks its kernel configs from it (it uses a fixed size hint instead). Without
this, the speed of a compiled kernel depended on which shape happened to come
first in the process: measured at one order, served at another, the choice was
wrong (seen on the H100: 2.5x slower at off-grid shapes).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import torch

from ..specs import KernelSpec
from . import eager

LEADING = "leading"  # every dim but the last


def _mark(args: tuple, token_dims: dict[int, tuple | str]) -> None:
    for index, dims in token_dims.items():
        tensor = args[index]
        for dim in range(tensor.dim() - 1) if dims == LEADING else dims:
            torch._dynamo.decorators.mark_unbacked(tensor, dim)


def lazily_compiled(fn: Callable, token_dims: dict[int, tuple | str]) -> Callable:
    compiled = None
    traced_ranks: set[int] = set()  # a new rank means a new trace: mark its token dims again
    lock = threading.Lock()

    def run(*args):
        nonlocal compiled
        if compiled is None:
            with lock:
                if compiled is None:
                    compiled = torch.compile(fn, dynamic=True)
        rank = args[0].dim()
        if rank not in traced_ranks:
            with lock:
                _mark(args, token_dims)
                traced_ranks.add(rank)
        return compiled(*args)

    run.__name__ = f"compiled_{fn.__name__}"
    return run


def compile_variant(spec: KernelSpec, kernel_id: str, token_dims: dict[int, tuple | str]) -> KernelSpec:
    return dataclasses.replace(spec, kernel_id=kernel_id, impl=lazily_compiled(spec.impl, token_dims), library="torch",
                               jit=True, jit_caches=("inductor", "triton"), deterministic=False,
                               notes=f"torch.compile(dynamic=True, token dims unbacked) of {spec.kernel_id}")


_EAGER = {s.kernel_id: s for s in eager.SPECS}
SPECS = [
    compile_variant(_EAGER["eager.rms_norm"], "compile.rms_norm", {0: LEADING}),
    # q, k: (batch, heads, seq, d); cos, sin: (batch or 1, seq, d)
    compile_variant(_EAGER["eager.rope"], "compile.rope", {0: (2,), 1: (2,), 2: (1,), 3: (1,)}),
    compile_variant(_EAGER["eager.swiglu"], "compile.swiglu", {0: LEADING, 1: LEADING}),
]
