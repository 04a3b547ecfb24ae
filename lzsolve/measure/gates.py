"""The two gates a candidate passes before it is timed.

1. capability: the kernel's declared spec against the op signature and device
   (runtime_loader.specs.KernelSpec.check), no tensors involved;
2. parity: the kernel's output on fresh random inputs against the op's fp32
   reference, within the op's tolerance for the dtype, on its first call (which may
   compile) and on a second, the steady call its timings are made of.
A candidate that fails either gets a structured Reason and is never chosen.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lzsolve.measure.harness import Harness, describe
from lzsolve.ops import OpContract, compare, to_fp32
from runtime_loader.dtypes import DTYPES
from runtime_loader.ops import OPS, Signature
from runtime_loader.parity import as_tuple
from runtime_loader.specs import OOM, PARITY_FAILED, RAISED, DeviceInfo, KernelSpec, Reason


def capability_gate(spec: KernelSpec, sig: Signature, device: DeviceInfo) -> list[Reason]:
    return spec.check(sig, device)


@dataclass(frozen=True)
class Parity:
    reason: Reason | None  # None: admitted
    first_call_ms: float | None = None
    errors: dict = field(default_factory=dict)  # rel_l2, max_rel


def reason_for(e: BaseException) -> Reason:
    """The Reason for a candidate that raised: OOM for any out-of-memory, else RAISED."""
    out_of_memory = isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e)
    return Reason(OOM if out_of_memory else RAISED, describe(e))


def poison_output_blocks(reference: torch.Tensor | tuple, dtype: torch.dtype) -> None:
    """Fill the CUDA caching allocator's free blocks of the outputs' sizes (in `dtype` and in the
    reference's own) with NaN bits (0xFF), then free them again: a kernel's outputs are the blocks
    its allocations find there, and the candidate before it wrote its answer to these same inputs
    into them. A kernel that leaves rows unwritten then reads NaN there, not that answer: Helion
    1.4.0's RMSNorm, compiled for one row and called with 64, passed parity on an H100, by all
    appearances that way (benchmarks/runs/2026-12-07-e.txt)."""
    outputs = [r for r in as_tuple(reference) if isinstance(r, torch.Tensor) and r.is_cuda]
    try:
        blocks = [torch.full((r.numel() * size,), 255, dtype=torch.uint8, device=r.device)
                  for r in outputs for size in sorted({dtype.itemsize, r.element_size()})]
    except torch.OutOfMemoryError:  # best effort: a workload this near the memory's end is checked unpoisoned
        return
    del blocks


def parity_gate(contract: OpContract, spec: KernelSpec, sig: Signature, args: tuple, harness: Harness,
                reference: torch.Tensor | tuple | None = None) -> Parity:
    """Run `spec` on `args` (fresh random inputs from the contract) and compare with the fp32
    reference (computed here unless given), twice: the first call, which is also the workload's
    first-call (JIT) time, and a second on the inputs as they were (the op may write over some),
    the call every later one repeats; each on output blocks poisoned first (poison_output_blocks).
    A kernel may be right only on the call that compiles it."""
    if reference is None:
        reference = contract.reference(*to_fp32(args))
    kept = {i: args[i].clone() for i in OPS[sig.op].consumed(args) if isinstance(args[i], torch.Tensor)}
    again = tuple(kept.get(i, arg) for i, arg in enumerate(args))
    dtype = DTYPES[sig.dtype]
    try:
        poison_output_blocks(reference, dtype)
        out, first_ms = harness.first_call(lambda: spec.impl(*args))
        ok, errors, message = compare(out, reference, contract.tolerances[sig.dtype])
        if not ok:
            return Parity(Reason(PARITY_FAILED, message), first_ms, errors)
        changed = [OPS[sig.op].parameters[i].name for i, before in kept.items() if not torch.equal(args[i], before)]
        if changed and "keep_inputs" in sig.flags:  # right results, but written over inputs the caller keeps
            return Parity(Reason(PARITY_FAILED, f"wrote into {', '.join(changed)}, which keep_inputs leaves as they "
                                                f"were"), first_ms, errors)
        poison_output_blocks(reference, dtype)
        ok, second, message = compare(spec.impl(*again), reference, contract.tolerances[sig.dtype])
    except Exception as e:  # any failure of a candidate is its Reason, never the tuner's crash
        return Parity(reason_for(e))
    if not ok:
        return Parity(Reason(PARITY_FAILED, f"right on its first call, then {message} on the same inputs"),
                      first_ms, second)
    return Parity(None, first_ms, {k: max(errors[k], second[k]) for k in errors})
