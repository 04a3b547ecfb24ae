"""torch.compile variants of the eager kernels (Inductor: Triton on CUDA, C++ on CPU).

One compiled graph serves every token count, and it is the same graph whatever
the order of calls: the token dims are marked *unbacked* when a graph is traced
(no specialisation on the first shape seen, nor on 1), and the first call of a
new graph is made at PRIME_TOKENS, so Inductor's runtime autotuning picks its
kernel configs at that size, not at whatever size came first. Without this the
speed of a compiled kernel depended on the call history of the process: measured
in one order and served in another, it was up to 4x slower than measured (seen
on the H100).
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import torch

from .. import ops
from ..ops.conv import causal_conv1d_taps
from ..specs import KernelSpec

LEADING = "leading"  # every dim but the last
PRIME_TOKENS = 256


def _dims(tensor: torch.Tensor, dims: tuple | str) -> tuple:
    return tuple(range(tensor.dim() - 1)) if dims == LEADING else dims


def _row_padded(tensor: torch.Tensor) -> bool:
    """A 2-D view whose rows sit further apart than their length: gate and up arrive as the two
    halves of one gate_up buffer. (Not is_contiguous(): a one-row view of it is contiguous.)"""
    return tensor.dim() == 2 and tensor.stride(1) == 1 and tensor.stride(0) > tensor.shape[1]


def _priming_args(args: tuple, token_dims: dict[int, tuple | str]) -> tuple:
    """The call's arguments with every token dim resized to PRIME_TOKENS (random data from a
    private generator: the caller's random stream is not ours to advance)."""
    primed = list(args)
    for index, dims in token_dims.items():
        tensor = args[index]
        shape = [PRIME_TOKENS if d in _dims(tensor, dims) else n for d, n in enumerate(tensor.shape)]
        gen = torch.Generator(device=tensor.device).manual_seed(index)
        # Same row stride as the call (gate and up arrive as halves of one gate_up buffer):
        # a graph traced on other strides would be guarded out and retraced on the real call.
        if _row_padded(tensor):
            primed[index] = torch.randn((shape[0], tensor.stride(0)), dtype=tensor.dtype, device=tensor.device,
                                        generator=gen)[:, :tensor.shape[1]]
        else:
            primed[index] = torch.randn(shape, dtype=tensor.dtype, device=tensor.device, generator=gen)
    return tuple(primed)


def _mark(args: tuple, token_dims: dict[int, tuple | str]) -> None:
    for index, dims in token_dims.items():
        for dim in _dims(args[index], dims):
            torch._dynamo.decorators.mark_unbacked(args[index], dim)
        if _row_padded(args[index]):  # Dynamo traces a view through its base: free the base's rows too
            torch._dynamo.decorators.mark_unbacked(args[index]._base, 0)


def lazily_compiled(fn: Callable, token_dims: dict[int, tuple | str]) -> Callable:
    compiled = None
    traced: set[tuple] = set()  # a new rank, dtype or device means a new trace: prime and mark it too
    lock = threading.Lock()

    def run(*args):
        nonlocal compiled
        if compiled is None:
            with lock:
                if compiled is None:
                    compiled = torch.compile(fn, dynamic=True)
        # trailing options (unit_offset) change the graph too: a new kind is primed, not traced at its call
        kind = (args[0].dim(), args[0].dtype, args[0].is_cuda, _row_padded(args[0]),
                tuple(a for a in args if isinstance(a, bool)))
        if kind not in traced:
            with lock:
                if kind not in traced:
                    primed = _priming_args(args, token_dims)
                    _mark(primed, token_dims)
                    compiled(*primed)  # trace, compile and autotune at PRIME_TOKENS
                    traced.add(kind)
        return compiled(*args)

    run.__name__ = f"compiled_{fn.__name__}"
    run.__wrapped__ = fn  # its source, too, is what the compiled kernel's version covers
    return run


def compile_variant(spec: KernelSpec, kernel_id: str, token_dims: dict[int, tuple | str]) -> KernelSpec:
    return dataclasses.replace(spec, kernel_id=kernel_id, impl=lazily_compiled(spec.impl, token_dims), library="torch",
                               jit=True, jit_caches=("inductor", "triton"), deterministic=False,
                               notes=f"torch.compile(dynamic=True, token dims unbacked) of {spec.kernel_id}")


_EAGER = {s.kernel_id: s for s in ops.SPECS}
SPECS = [
    compile_variant(_EAGER["eager.rms_norm"], "compile.rms_norm", {0: LEADING}),
    compile_variant(_EAGER["eager.rms_norm_add"], "compile.rms_norm_add", {0: LEADING, 1: LEADING}),
    compile_variant(_EAGER["eager.layer_norm"], "compile.layer_norm", {0: LEADING}),
    # q, k: (batch, heads, seq, d); cos, sin: (batch or 1, seq, d)
    compile_variant(_EAGER["eager.rope"], "compile.rope", {0: (2,), 1: (2,), 2: (1,), 3: (1,)}),
    compile_variant(_EAGER["eager.swiglu"], "compile.swiglu", {0: LEADING, 1: LEADING}),
    compile_variant(_EAGER["eager.geglu"], "compile.geglu", {0: LEADING, 1: LEADING}),
    compile_variant(_EAGER["eager.gelu"], "compile.gelu", {0: LEADING}),
    compile_variant(_EAGER["eager.sigmoid_gate"], "compile.sigmoid_gate", {0: LEADING, 1: LEADING}),
    compile_variant(_EAGER["eager.deltanet_gates"], "compile.deltanet_gates", {0: LEADING, 1: LEADING}),
    compile_variant(_EAGER["eager.moe_router"], "compile.moe_router", {0: (0,)}),
    # the conv's taps as multiply-adds, which Inductor fuses; no dim unbacked (torch 2.11's Inductor
    # failed to lower those slices over an unbacked seq on the H100): traced at the first call's shape,
    # dynamic from the next
    dataclasses.replace(compile_variant(dataclasses.replace(_EAGER["eager.causal_conv1d"], impl=causal_conv1d_taps),
                                        "compile.causal_conv1d", {}),
                        notes="torch.compile(dynamic=True) of the conv as width multiply-adds"),
]
