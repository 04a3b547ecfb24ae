"""Op contracts: the tuner's half of each op of runtime_loader.ops.OPS, attached by the op's name.

At import every op has exactly one contract, and every contract names an op, with cases to check
its kernels on; a plugin's op adds its contract with register_contract.
"""
from runtime_loader.ops import OPS

from .act import GEGLU, GELU, SIGMOID_GATE, SWIGLU, SWIGLU_FP8
from .attention import DECODE, DECODE_FP8KV, PREFILL
from .conv import CAUSAL_DEPTHWISE
from .base import TOLERANCES, OpContract, Tolerance, compare, to_fp32
from .embedding import EMBEDDING, LEARNED
from .linear import LINEAR, LINEAR_FP8, LINEAR_FP8_PREQUANTISED
from .moe import EXPERTS, ROUTER
from .norm import LAYER, QK, RMS, RMS_ADD, RMS_ADD_FP8, RMS_FP8
from .recurrent import DELTANET_GATES, GATED_DELTANET
from .rope import ROPE

CONTRACTS: dict[str, OpContract] = {c.op: c for c in (
    PREFILL, DECODE, DECODE_FP8KV, RMS, RMS_ADD, RMS_FP8, RMS_ADD_FP8, QK, LAYER, ROPE, LEARNED, EMBEDDING, SWIGLU,
    SWIGLU_FP8, GEGLU, GELU, SIGMOID_GATE, LINEAR, LINEAR_FP8, LINEAR_FP8_PREQUANTISED,
    CAUSAL_DEPTHWISE, DELTANET_GATES, GATED_DELTANET, EXPERTS, ROUTER)}


def check_contracts() -> None:
    """RuntimeError unless every op record has a contract with cases, and every contract an op record."""
    without_contract = sorted(set(OPS) - set(CONTRACTS))
    without_op = sorted(set(CONTRACTS) - set(OPS))
    without_cases = sorted(op for op, c in CONTRACTS.items() if not c.cases)
    if without_contract or without_op or without_cases:
        raise RuntimeError(f"op records without a contract: {without_contract}; contracts without an op record "
                           f"(runtime_loader.ops.OPS): {without_op}; contracts without cases: {without_cases}")


def register_contract(contract: OpContract) -> OpContract:
    """Attach a plugin op's contract to its record (register the record first)."""
    if contract.op in CONTRACTS:
        raise ValueError(f"op {contract.op!r} already has a contract")
    CONTRACTS[contract.op] = contract
    check_contracts()
    return contract


check_contracts()

__all__ = ["CONTRACTS", "OpContract", "TOLERANCES", "Tolerance", "check_contracts", "compare", "register_contract",
           "to_fp32"]
