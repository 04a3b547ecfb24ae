"""Op contracts, one per op of runtime_loader.ops.OPS."""
from runtime_loader.ops import OPS

from .act import GEGLU, GELU, SIGMOID_GATE, SWIGLU
from .attention import DECODE, PREFILL
from .base import TOLERANCES, OpContract, Tolerance, compare, to_fp32
from .embedding import EMBEDDING, LEARNED
from .linear import LINEAR
from .norm import LAYER, QK, RMS, RMS_ADD
from .recurrent import GATED_DELTANET
from .rope import ROPE

CONTRACTS: dict[str, OpContract] = {c.op: c for c in (
    PREFILL, DECODE, RMS, RMS_ADD, QK, LAYER, ROPE, LEARNED, EMBEDDING, SWIGLU, GEGLU, GELU, SIGMOID_GATE, LINEAR,
    GATED_DELTANET)}
assert set(CONTRACTS) == set(OPS), "every runtime op needs a contract"

__all__ = ["CONTRACTS", "OpContract", "TOLERANCES", "Tolerance", "compare", "to_fp32"]
