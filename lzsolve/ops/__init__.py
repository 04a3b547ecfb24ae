"""Op contracts: the tuner's half of each op (fp32 reference, tolerances, FLOPs and bytes, the cases
its kernels are checked on), attached to its record by the op's name.

One module per op family, named as the runtime's (runtime_loader.ops.<family> holds the records,
inputs and eager kernels; lzsolve.ops.<family> the contracts, listed in its CONTRACTS). At import
every op has exactly one contract, in the module of its family, with cases; a plugin's op adds
its contract with register_contract.
"""
import importlib

from lzsolve.ops.base import TOLERANCES, OpContract, Tolerance, compare, to_fp32
from runtime_loader.ops import FAMILIES, OPS

CONTRACTS: dict[str, OpContract] = {}
for _family, _runtime in FAMILIES.items():
    _module = importlib.import_module(f"{__name__}.{_family}")
    _records = {record.name for record in _runtime.RECORDS}
    for _contract in _module.CONTRACTS:
        if _contract.op not in _records:
            raise RuntimeError(f"lzsolve.ops.{_family} holds the contract of {_contract.op}, whose record is not in "
                               f"runtime_loader.ops.{_family}")
        CONTRACTS[_contract.op] = _contract


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
