"""Operator policy: turn the table off, avoid libraries, or lock an op to one kernel, without re-tuning.

    LZSOLVE_DISABLE=1                           every call uses the fallback
    LZSOLVE_AVOID=flashinfer,liger              kernels of these libraries are not used (the leaf's
                                                next ranked kernel serves instead, then the fallback)
    LZSOLVE_LOCK=norm.rms=torch.rms_norm,...    every call of the op uses this kernel where it can
                                                compute the call (the fallback, with a warning, where not)

load(avoid=[...], lock={...}, disable=True) adds to the environment's policy; inside
`with runtime_loader.policy(...)` (for tests) the environment is ignored. Kernel ids and ops are
checked against the registry at load: a lock naming an unknown kernel, another op's kernel or a
kernel that cannot run here is dropped with a warning (TableError when strict).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import registry
from .ops import OPS
from .safeio import shown, warn


class PolicyError(ValueError):
    """A policy that names something this runtime does not know, or cannot honour."""


@dataclass(frozen=True)
class Policy:
    disable: bool = False
    avoid: frozenset[str] = frozenset()  # libraries (KernelSpec.library), e.g. "flashinfer-python"
    lock: dict[str, str] = field(default_factory=dict)  # op -> kernel id

    def __bool__(self) -> bool:
        return self.disable or bool(self.avoid) or bool(self.lock)

    def avoids(self, kernel_id: str) -> bool:
        return registry.get(kernel_id).library in self.avoid

    def merged(self, disable: bool = False, avoid=(), lock=None) -> Policy:
        """This policy and load()'s arguments; TypeError, naming the argument and its form, for one
        of the wrong type (Python's own messages named neither: "'str' object is not a mapping")."""
        if not isinstance(disable, bool):
            raise TypeError(f"disable={shown(disable)}: pass True or False")
        if not isinstance(avoid, str):
            names = tuple(avoid) if isinstance(avoid, Iterable) and not isinstance(avoid, (bytes, Mapping)) else None
            if names is None or not all(isinstance(name, str) for name in names):
                raise TypeError(f"avoid={shown(avoid)}: pass library names, a list or 'lib,lib' "
                                "(e.g. ['flashinfer-python'])")
            avoid = names
        if lock is not None and not (isinstance(lock, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                    for k, v in lock.items())):
            raise TypeError(f"lock={shown(lock)}: pass a dict of op to kernel id (e.g. {{'norm.rms': 'torch.rms_norm'}})")
        return Policy(self.disable or disable, self.avoid | libraries(avoid), {**self.lock, **(lock or {})})

    def describe(self) -> str:
        parts = ["disabled: every call uses the fallback"] if self.disable else []
        if self.avoid:
            parts.append(f"avoid {', '.join(sorted(self.avoid))}")
        parts += [f"lock {op}={kernel_id}" for op, kernel_id in sorted(self.lock.items())]
        return "; ".join(parts) or "none"


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: configured ids hold commas (triton.rms_norm[block=1024,warps=4])."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return [item.strip() for item in items if item.strip()]


def libraries(avoid) -> frozenset[str]:
    """avoid as a set of library names: a list, or one string 'lib,lib' (as in LZSOLVE_AVOID)."""
    return frozenset(split_top_level(avoid) if isinstance(avoid, str) else avoid)


def parse_lock(text: str, strict: bool = False) -> dict[str, str]:
    """'op=kernel_id,op=kernel_id' -> {op: kernel_id}. An item that is not op=kernel_id is dropped
    with a warning, or raises PolicyError when strict: a typo in one lock must not take the rest of
    the policy (LZSOLVE_DISABLE, the kill switch, among it) down with it."""
    lock = {}
    for item in split_top_level(text):
        op, sep, kernel_id = item.partition("=")
        if sep and op.strip() and kernel_id.strip():
            lock[op.strip()] = kernel_id.strip()
            continue
        problem = f"LZSOLVE_LOCK item {item!r} is not op=kernel_id"
        if strict:
            raise PolicyError(problem)
        # stacklevel: parse_lock, from_env, current_policy, load, then load's caller
        warn(f"lzsolve: policy: {problem}; ignored (write it as op=kernel_id, e.g. "
             "norm.rms=torch.rms_norm)", stacklevel=5)
    return lock


def from_env(environ=None, strict: bool = False) -> Policy:
    """The environment's policy; a malformed LZSOLVE_LOCK item is dropped alone (parse_lock)."""
    environ = os.environ if environ is None else environ
    disable = environ.get("LZSOLVE_DISABLE", "").strip().lower() not in ("", "0", "false", "no")
    avoid = libraries(environ.get("LZSOLVE_AVOID", ""))
    return Policy(disable, avoid, parse_lock(environ.get("LZSOLVE_LOCK", ""), strict))


_override: list[Policy] = []  # the policies of the enclosing `policy(...)` blocks, innermost last


def current_policy(strict: bool = False) -> Policy:
    """The policy a load starts from: the innermost `policy(...)` block's, else the environment's
    (strict: PolicyError on a malformed item instead of a warning)."""
    return _override[-1] if _override else from_env(strict=strict)


@contextlib.contextmanager
def policy(disable: bool = False, avoid=(), lock=None):
    """Loads inside the block use this policy instead of the environment's (for tests)."""
    _override.append(Policy(disable, libraries(avoid), dict(lock or {})))
    try:
        yield _override[-1]
    finally:
        _override.pop()


def lock_problem(op: str, kernel_id: str, device) -> str | None:
    """Why a lock cannot be honoured on this device at all (None: it can, where the kernel computes the call)."""
    if op not in OPS:
        return f"unknown op {op!r}"
    if not registry.known(kernel_id):
        return f"unknown kernel id {kernel_id!r}"
    spec = registry.get(kernel_id)
    if op not in spec.ops:
        return f"{kernel_id} implements {sorted(spec.ops)}, not {op}"
    local = spec.local_reasons(device, load=False)
    return str(local[0]) if local else None
