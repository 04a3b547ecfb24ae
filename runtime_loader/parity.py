"""Parity: a kernel's output against a reference, within a tolerance per dtype. The tuner's
gate checks candidates against each op's fp32 reference with it (lzsolve.ops); load(verify=True)
checks a table's kernels against the op's fallback before trusting them."""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
