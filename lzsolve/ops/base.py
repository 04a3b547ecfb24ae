"""The op contract: the tuner's half of one op (fp32 reference, tolerances, roofline counts).

The runtime half (signature dims, how a call is served, fallback kernel, example inputs) is
the op's record in `runtime_loader.ops.OPS`; a contract is attached to it by the op's name.
This half is what the solver needs to check and measure candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from runtime_loader.inputs import randn
from runtime_loader.ops import DTYPES, OPS, OpSchema, Signature

__all__ = ["FP8_OUT_TOLERANCES", "OpContract", "Tolerance", "TOLERANCES", "compare", "itemsize", "randn", "to_fp32"]


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float  # ||out - ref|| / ||ref||
    max_rel: float  # max |out - ref| / max |ref|: catches a few wrong rows that L2 would average away


# Measured spread of correct kernels sits several times below these (tests/test_ops.py).
TOLERANCES = {
    "fp32": Tolerance(rel_l2=1e-4, max_rel=1e-3),
    "fp16": Tolerance(rel_l2=4e-3, max_rel=8e-3),
    "bf16": Tolerance(rel_l2=2e-2, max_rel=4e-2),
}


# Ops whose output is an FP8 linear's quantised input (norm.rms_fp8, act.swiglu_fp8): q compared by
# value, the scales apart. Rounding the rows to bf16 on the way (as an unfused server does: eager's
# SiLU, then its product, each rounded) moves some of them across an e4m3 rounding boundary, one
# step each: 1.6-2.5e-2 of L2 in bf16 (CPU, the contract's cases), one step of 32 near 448 (7% of
# the row's largest value) at most. A wrong norm, activation or scale layout moves every element.
FP8_OUT_TOLERANCES = dict.fromkeys(("fp32", "fp16", "bf16"), Tolerance(rel_l2=5e-2, max_rel=8e-2))


@dataclass(frozen=True)
class OpContract:
    op: str
    # the canonical call args (make_inputs) with float tensors in fp32 -> fp32 output (tensor or tuple of tensors)
    reference: Callable
    flops: Callable[[Signature, dict], float]
    bytes_moved: Callable[[Signature, dict], float]
    # signatures every kernel of the op is checked on (tests/test_kernels.py): shapes that exercise
    # every feature combination a kernel can claim (causal or not, GQA or not, both RoPE layouts, bias
    # or not, sliding window, softcap, (1 + weight) norms...) and odd sizes that do not fill a tile.
    # Options are set so a kernel that ignored one would fail (windows shorter than the sequence,
    # softcaps small enough to bend N(0, 1) scores). (static dims, flags, dynamic dims)
    cases: tuple[tuple[dict, tuple[str, ...], dict], ...] = ()
    tolerances: dict[str, Tolerance] = field(default_factory=lambda: TOLERANCES)

    @property
    def schema(self) -> OpSchema:
        return OPS[self.op]

    @property
    def make_inputs(self) -> Callable[[Signature, dict, torch.device, torch.Generator], tuple]:
        """(signature, dynamic dims, device, generator) -> the canonical call args: the op record's
        inputs, the ones the runtime warms up with (runtime_loader.inputs)."""
        return OPS[self.op].inputs


def itemsize(sig: Signature) -> int:
    return DTYPES[sig.dtype].itemsize


def to_fp32(args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def compare(out, ref, tol: Tolerance) -> tuple[bool, dict, str]:
    """Check a kernel's output against the fp32 reference: (ok, worst errors, message)."""
    outs, refs = as_tuple(out), as_tuple(ref)
    if len(outs) != len(refs):
        return False, {}, f"returned {len(outs)} tensors, expected {len(refs)}"
    worst = {"rel_l2": 0.0, "max_rel": 0.0}
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor) or o.shape != r.shape:
            got = tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__
            return False, {}, f"output {i} has shape {got}, expected {tuple(r.shape)}"
        if not r.is_floating_point():  # indices (a router's expert ids): exactly, or not at all
            if not torch.equal(o.to(r.device, r.dtype), r):
                wrong = (o.to(r.device, r.dtype) != r).float().mean().item()
                return False, {}, f"output {i}: {wrong:.1%} of its integers differ from the reference's"
            continue
        o = o.float()
        if not torch.isfinite(o).all():
            return False, {}, f"output {i} has NaN or Inf"
        err = (o - r).abs()
        scale = r.abs().max().clamp_min(1e-30)
        worst["rel_l2"] = max(worst["rel_l2"], (torch.linalg.vector_norm(o - r) /
                                                torch.linalg.vector_norm(r).clamp_min(1e-30)).item())
        worst["max_rel"] = max(worst["max_rel"], (err.max() / scale).item())
    if worst["rel_l2"] > tol.rel_l2 or worst["max_rel"] > tol.max_rel:
        return False, worst, (f"rel_l2 {worst['rel_l2']:.2e} (limit {tol.rel_l2:.0e}), "
                              f"max_rel {worst['max_rel']:.2e} (limit {tol.max_rel:.0e})")
    return True, worst, "ok"
