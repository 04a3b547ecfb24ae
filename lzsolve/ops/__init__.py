"""Op contracts, one per op of runtime_loader.ops.OPS."""
from runtime_loader.ops import OPS

from .act import GEGLU, GELU, SWIGLU
from .attention import DECODE, PREFILL
from .base import TOLERANCES, OpContract, Tolerance, compare, to_fp32
from .linear import LINEAR
from .norm import LAYER, RMS, RMS_ADD
from .rope import ROPE

CONTRACTS: dict[str, OpContract] = {c.op: c for c in (PREFILL, DECODE, RMS, RMS_ADD, LAYER, ROPE, SWIGLU, GEGLU, GELU, LINEAR)}
assert set(CONTRACTS) == set(OPS), "every runtime op needs a contract"

__all__ = ["CONTRACTS", "OpContract", "TOLERANCES", "Tolerance", "compare", "to_fp32"]
