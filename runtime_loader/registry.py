"""The kernel registry: the only way a kernel id becomes a callable.

Ids read from an artifact are looked up here and nowhere else, so a table can
only name kernels this runtime already knows.
"""
from __future__ import annotations

import hashlib
import json

from .kernels import ALL_SPECS, ALL_TUNABLES
from .ops import OPS
from .specs import KernelSpec, Tunable, parse_config_id

REGISTRY: dict[str, KernelSpec] = {}  # every kernel a search starts from: fixed kernels and default configs
TUNABLES: dict[str, Tunable] = {}  # base id -> family
_CONFIGURED: dict[str, KernelSpec] = {}  # configurations built so far, by id


def register(spec: KernelSpec) -> KernelSpec:
    """Add a kernel (built-in adapters, or a plugin module's own) under its unique id.
    A table can name only registered ids, so plugins register before `load`."""
    if spec.kernel_id in REGISTRY and REGISTRY[spec.kernel_id] is not spec:
        raise ValueError(f"kernel id {spec.kernel_id!r} is already registered")
    REGISTRY[spec.kernel_id] = spec
    return spec


def register_tunable(tunable: Tunable) -> Tunable:
    """Add a family: its default configuration under the base id, the others on demand."""
    register(tunable.spec)
    TUNABLES[tunable.base_id] = tunable
    return tunable


for _spec in ALL_SPECS:
    register(_spec)
for _tunable in ALL_TUNABLES:
    register_tunable(_tunable)


def get(kernel_id: str) -> KernelSpec:
    """The spec of `kernel_id`, including configurations of tunable families
    ('triton.rms_norm[block=1024,warps=4]'); KeyError for ids this runtime does not know."""
    spec = REGISTRY.get(kernel_id) or _CONFIGURED.get(kernel_id)
    if spec is not None:
        return spec
    parsed = parse_config_id(kernel_id)
    if parsed is None or parsed[0] not in TUNABLES:
        raise KeyError(kernel_id)
    try:
        spec = TUNABLES[parsed[0]].configured(parsed[1])
    except ValueError as e:
        raise KeyError(f"{kernel_id}: {e}") from None
    if spec.kernel_id != kernel_id:  # one id per kernel: no reordered, repeated or zero-padded spellings
        raise KeyError(f"{kernel_id}: not the canonical spelling {spec.kernel_id}")
    return _CONFIGURED.setdefault(kernel_id, spec)


def family(kernel_id: str) -> str:
    """The base id of a tunable family's configuration ('triton.rms_norm[block=1024,warps=4]': its
    family 'triton.rms_norm'); any other id is its own."""
    parsed = parse_config_id(kernel_id)
    return parsed[0] if parsed is not None and parsed[0] in TUNABLES else kernel_id


def plain_id(kernel_id: str) -> str:
    """The id of the kernel a configuration runs: the family's base id for its default configuration
    (the family's registered kernel is that configuration), the id itself otherwise."""
    parsed = parse_config_id(kernel_id)
    if parsed is not None and parsed[0] in TUNABLES and parsed[1] == TUNABLES[parsed[0]].default:
        return parsed[0]
    return kernel_id


def known(kernel_id: str) -> bool:
    try:
        get(kernel_id)
        return True
    except KeyError:
        return False


def candidates(op: str) -> list[KernelSpec]:
    return [spec for spec in REGISTRY.values() if op in spec.ops]


def fallback(op: str) -> KernelSpec:
    return REGISTRY[OPS[op].fallback]


def fallback_for(sig) -> KernelSpec:
    """The fallback that computes `sig`: the op's usual one (SDPA, eager torch), or its reference
    implementation when the usual one lacks a feature the signature needs (e.g. a logit softcap)."""
    primary = fallback(sig.op)
    reference = OPS[sig.op].reference
    if reference and primary.semantic_reasons(sig):
        return REGISTRY[reference]
    return primary


def capabilities_hash() -> str:
    """sha256 of every declared capability: a table solved against other declarations is stale."""
    blob = json.dumps([REGISTRY[k].capabilities_hash() for k in sorted(REGISTRY)]
                      + [TUNABLES[k].data() for k in sorted(TUNABLES)], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
