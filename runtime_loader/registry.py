"""The kernel registry: the only way a kernel id becomes a callable.

Ids read from an artifact are looked up here and nowhere else, so a table can
only name kernels this runtime already knows.
"""
from __future__ import annotations

import hashlib
import json

from .kernels import ALL_SPECS
from .ops import OPS
from .specs import KernelSpec

REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    """Add a kernel (built-in adapters, or a plugin module's own) under its unique id.
    A table can name only registered ids, so plugins register before `load`."""
    if spec.kernel_id in REGISTRY and REGISTRY[spec.kernel_id] is not spec:
        raise ValueError(f"kernel id {spec.kernel_id!r} is already registered")
    REGISTRY[spec.kernel_id] = spec
    return spec


for _spec in ALL_SPECS:
    register(_spec)


def get(kernel_id: str) -> KernelSpec:
    """The spec of `kernel_id`; KeyError for ids this runtime does not know."""
    return REGISTRY[kernel_id]


def candidates(op: str) -> list[KernelSpec]:
    return [spec for spec in REGISTRY.values() if op in spec.ops]


def fallback(op: str) -> KernelSpec:
    return REGISTRY[OPS[op].fallback]


def capabilities_hash() -> str:
    """sha256 of every declared capability: a table solved against other declarations is stale."""
    blob = json.dumps([REGISTRY[k].capabilities_hash() for k in sorted(REGISTRY)])
    return hashlib.sha256(blob.encode()).hexdigest()
