"""The op contract: the tuner's half of one op (fp32 reference, tolerances, roofline counts).

The runtime half (signature dims, how a call is served, fallback kernel, example inputs) is
the op's record in `runtime_loader.ops.<family>`; a contract is attached to it by the op's name.
This half is what the solver needs to check and measure candidates.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from runtime_loader.dtypes import DTYPES
from runtime_loader.inputs import randn
from runtime_loader.ops import OPS, OpSchema, Signature
from runtime_loader.parity import TOLERANCES, Tolerance, compare, to_fp32

__all__ = ["FP8_OUT_TOLERANCES", "OpContract", "Tolerance", "TOLERANCES", "compare", "itemsize", "randn", "to_fp32"]


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
        inputs, the ones the runtime warms up with (runtime_loader.ops.<family>)."""
        return OPS[self.op].inputs


def itemsize(sig: Signature) -> int:
    return DTYPES[sig.dtype].itemsize
