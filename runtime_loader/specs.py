"""Kernel specs (capabilities declared as data) and structured Reasons.

A capability field that is missing means "unsupported": a spec with no dtypes
supports no dtype, a spec with ``head_dim_max=0`` supports no op that has a
head dim. ``check`` is the one capability gate; the solver uses it before
measuring and the runtime uses it again before trusting a table entry.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .ops import Signature


# Reason codes (DESIGN.md vocabulary). FEATURE_UNSUPPORTED carries the feature
# after a colon, e.g. "FEATURE_UNSUPPORTED:gqa".
NOT_INSTALLED = "NOT_INSTALLED"
BACKEND_IMPORT_FAILED = "BACKEND_IMPORT_FAILED"
OP_UNSUPPORTED = "OP_UNSUPPORTED"
PLATFORM_MISMATCH = "PLATFORM_MISMATCH"
SM_TOO_OLD = "SM_TOO_OLD"
SM_TOO_NEW = "SM_TOO_NEW"
DTYPE_UNSUPPORTED = "DTYPE_UNSUPPORTED"
HEAD_DIM_UNSUPPORTED = "HEAD_DIM_UNSUPPORTED"
FEATURE_UNSUPPORTED = "FEATURE_UNSUPPORTED"
RAISED = "RAISED"  # the candidate raised a Python exception on a real input
PARITY_FAILED = "PARITY_FAILED"
CRASHED = "CRASHED"
TIMEOUT = "TIMEOUT"
OOM = "OOM"
CUDA_GRAPH_UNSAFE = "CUDA_GRAPH_UNSAFE"  # runs, but cannot be captured in a CUDA graph
IMPLAUSIBLE_TIME = "IMPLAUSIBLE_TIME"  # timed faster than the device's roofline allows (lzsolve.decide.roofline)
EXCLUDED = "EXCLUDED"  # left out by the user's --kernels / --exclude filter

HEAD_DIM_ANY = 1 << 16  # head_dim_max for kernels with no head-dim limit


def _not_installed(module: str, library: str) -> Reason:
    """The kernel's library (the distribution a spec names) is what to install: `lzsolve[gpu]` has
    no flash-attn, and lzsolve itself is on no package index, so an extra of it is no hint."""
    return Reason(NOT_INSTALLED, f"python module {module!r} is not installed (pip install {library})")


@functools.cache
def _import_reason(module: str, library: str) -> Reason | None:
    try:
        if not _found(module):
            return _not_installed(module, library)
        importlib.import_module(module)
    except Exception as e:  # a broken install fails in many ways (ImportError, OSError, RuntimeError...)
        first_line = (str(e).strip().splitlines() or [""])[0][:300]
        return Reason(BACKEND_IMPORT_FAILED, f"import {module} failed: {type(e).__name__}: {first_line}")
    return None


def _found(module: str) -> bool:
    """Whether `module` is there, importing nothing: its top-level package, then each submodule in
    the folders of the one before. A package can share its name with another library's namespace:
    flash-attn-4 installs `flash_attn/cute` alone, where FlashAttention-2's `flash_attn` would be."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return False
    folders = [Path(f) for f in spec.submodule_search_locations or ()]
    for depth, part in enumerate(parts, 1):
        modules = [f for f in folders if (f / f"{part}.py").is_file() or any(f.glob(f"{part}.*.so"))]
        folders = [f / part for f in folders if (f / part).is_dir()]
        if depth == len(parts):
            return bool(modules or folders)
    return True


@functools.cache
def _find_reason(module: str, library: str) -> Reason | None:
    """_import_reason without the import: whether the module is there (_found)."""
    return None if _found(module) else _not_installed(module, library)


def source_files(impl) -> tuple[str, ...]:
    """The source files of an impl: its function's (through functools.partial and __wrapped__), and
    a `source_file` an impl names itself (a Triton kernel's module, imported only at its first call)."""
    files = []
    while impl is not None:
        named = getattr(impl, "source_file", None)
        if named:
            files.append(str(named))
        fn = impl.func if isinstance(impl, functools.partial) else impl
        code = getattr(fn, "__code__", None)
        if code is not None:
            files.append(code.co_filename)
        impl = getattr(fn, "__wrapped__", None)
    return tuple(dict.fromkeys(files))


@functools.cache
def _file_digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


@functools.cache
def library_version(library: str) -> str | None:
    """The installed distribution's version, read once per process: importlib.metadata parses the
    package's METADATA file on every call (5 ms on the H100 host), and a tune asks once per record,
    from the threads of every device, which take turns on the GIL (benchmarks/device.sh devices)."""
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def source_digest(impl) -> str:
    """8 hex digits over the source files behind `impl` ("" when none can be read)."""
    digests = [_file_digest(f) for f in source_files(impl)]
    if not any(digests):
        return ""
    return hashlib.sha256("".join(digests).encode()).hexdigest()[:8]


class Reason(NamedTuple):
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class DeviceInfo:
    """Where a kernel would run: 'cpu' or 'cuda' (with its SM version, e.g. 90)."""

    type: str
    sm: int | None = None


BOTH = frozenset({"cpu", "cuda"})  # the platforms of a kernel written in plain torch


def required_features(sig: Signature) -> frozenset[str]:
    """Features a kernel must declare to compute this signature correctly: its flags (causal, sinks,
    alibi...), then what its static dims imply."""
    features = set(sig.flags)
    static = dict(sig.static)
    if "hkv" in static and static["hq"] != static["hkv"]:
        features.add("gqa")
    if "layout" in static:
        features.add(f"rope_{static['layout']}")
    if static.get("window"):
        features.add("sliding_window")
    if static.get("softcap"):
        features.add("softcap")
    if "d" in static and static.get("dv"):  # attention whose v head dim differs from q's and k's (MLA)
        features.add("v_head_dim")
    if static.get("limit"):
        features.add("clamped_swiglu")
    if static.get("ep", 1) > 1:
        features.add("expert_parallel")
    if "hv" in static and static["hv"] != static["hk"]:
        features.add("gqa")
    return frozenset(features)


@dataclass(frozen=True)
class KernelSpec:
    kernel_id: str
    ops: frozenset[str]
    library: str  # distribution whose version is recorded ("torch", "flashinfer-python")
    impl: Callable = field(repr=False, compare=False)  # called with the op's canonical args
    platforms: frozenset[str] = frozenset()
    min_sm: int | None = None
    max_sm: int | None = None
    dtypes: frozenset[str] = frozenset()
    head_dim_max: int = 0
    head_dim_multiple: int = 1
    features: frozenset[str] = frozenset()
    graph_safe: bool = False
    deterministic: bool = False
    jit: bool = False  # compiles on first call: its jit time matters
    jit_caches: tuple[str, ...] = ()  # where it compiles to (runtime_loader.jit.JIT_CACHES): packed into artifacts
    requires: tuple[str, ...] = ()  # importable modules the adapter needs
    # its first call takes seconds besides compiling its kernel: a library whose import brings in
    # transformers, PEFT or torch._dynamo, or kernels compiled in the process's memory (the CuTe DSL).
    # Not a capability (no part of data(), so no table goes stale by it): `tune --quick` leaves these out
    slow_start: bool = field(default=False, compare=False)
    notes: str = ""
    # ms of one-time setup (e.g. a plan) the adapter did for the layout of these call args, once
    # the kernel has been called on them; recorded apart from jit and steady-state time
    setup_ms: Callable[..., float | None] | None = field(default=None, repr=False, compare=False)

    def data(self) -> dict:
        """The declared capabilities as plain data (hashed into the capabilities hash)."""
        return {
            "kernel_id": self.kernel_id,
            "ops": sorted(self.ops),
            "library": self.library,
            "platforms": sorted(self.platforms),
            "min_sm": self.min_sm,
            "max_sm": self.max_sm,
            "dtypes": sorted(self.dtypes),
            "head_dim_max": self.head_dim_max,
            "head_dim_multiple": self.head_dim_multiple,
            "features": sorted(self.features),
            "graph_safe": self.graph_safe,
            "deterministic": self.deterministic,
            "jit": self.jit,
            "jit_caches": list(self.jit_caches),
            "requires": list(self.requires),
        }

    def capabilities_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.data(), sort_keys=True).encode()).hexdigest()

    def installed(self, load: bool = True) -> Reason | None:
        """NOT_INSTALLED when a required module is missing, BACKEND_IMPORT_FAILED when it is there
        but does not import (wrong CUDA or torch build): the library's message, not a crash.
        load=False only looks for the modules (no import, so no BACKEND_IMPORT_FAILED): the
        runtime's start, which leaves imports to a kernel's first call."""
        for module in self.requires:
            reason = _import_reason(module, self.library) if load else _find_reason(module, self.library)
            if reason:
                return reason
        return None

    def version(self) -> str | None:
        """The library's version, plus a digest of this project's source behind the kernel (its
        adapter, its Triton kernel module) where there is one: what was measured is that code, so
        an edit of it makes earlier records and tables stale, as a library upgrade does."""
        library = library_version(self.library)
        if library is None:
            return None
        digest = source_digest(self.impl)
        return f"{library}+src.{digest}" if digest else library

    def check(self, sig: Signature, device: DeviceInfo) -> list[Reason]:
        """Every reason this kernel cannot compute `sig` on `device`; empty when admitted."""
        return self.local_reasons(device) + self.semantic_reasons(sig)

    def local_reasons(self, device: DeviceInfo, load: bool = True) -> list[Reason]:
        """Why this kernel cannot run on this machine at all (whatever the op); load: see installed.
        A kernel for another platform is looked for, not imported: its library's import would buy
        nothing (Helion's takes 5 s on a 2-core CPU)."""
        reasons = []
        missing = self.installed(load and device.type in self.platforms)
        if missing:
            reasons.append(missing)
        if device.type not in self.platforms:
            reasons.append(Reason(PLATFORM_MISMATCH, f"runs on {sorted(self.platforms)}, not {device.type}"))
        elif device.type == "cuda" and device.sm is not None:
            if self.min_sm is not None and device.sm < self.min_sm:
                reasons.append(Reason(SM_TOO_OLD, f"needs sm{self.min_sm}+, device is sm{device.sm}"))
            if self.max_sm is not None and device.sm > self.max_sm:
                reasons.append(Reason(SM_TOO_NEW, f"supports up to sm{self.max_sm}, device is sm{device.sm}"))
        return reasons

    def semantic_reasons(self, sig: Signature) -> list[Reason]:
        """Why this kernel would compute something other than `sig` (wherever it runs)."""
        reasons = []
        if sig.op not in self.ops:
            reasons.append(Reason(OP_UNSUPPORTED, f"{self.kernel_id} implements {sorted(self.ops)}, not {sig.op}"))
        if sig.dtype not in self.dtypes:
            reasons.append(Reason(DTYPE_UNSUPPORTED, f"supports {sorted(self.dtypes) or 'no dtype'}, not {sig.dtype}"))
        static = dict(sig.static)
        for dim in ("d", "dv") if "d" in static else ():  # attention's q/k head dim, and v's where it differs (MLA)
            d = static.get(dim)
            if d and (d > self.head_dim_max or d % self.head_dim_multiple):
                reasons.append(Reason(
                    HEAD_DIM_UNSUPPORTED,
                    f"head_dim {d} outside <= {self.head_dim_max}, multiple of {self.head_dim_multiple}"))
        for feature in sorted(required_features(sig) - self.features):
            reasons.append(Reason(f"{FEATURE_UNSUPPORTED}:{feature}", f"{self.kernel_id} does not declare {feature!r}"))
        return reasons


# --- tunable kernels --------------------------------------------------------------
# A kernel with parameters (block sizes, warps, split-K...) is a family: every
# configuration is a kernel of its own, named base[name=value,...] with the
# parameters in the family's order. Ids read from an artifact are parsed by this
# grammar alone and each value must be one the family declares, so a table can
# name a configuration but never smuggle in anything else.
CONFIG_ID = re.compile(r"([a-z0-9_.]+)\[([a-z_]+=[0-9]{1,6}(?:,[a-z_]+=[0-9]{1,6})*)\]")


def config_id(base: str, config: dict[str, int]) -> str:
    return f"{base}[{','.join(f'{name}={value}' for name, value in config.items())}]"


def parse_config_id(kernel_id: str) -> tuple[str, dict[str, int]] | None:
    """(base id, config) of 'base[name=value,...]'; None when the id is not of that form."""
    match = CONFIG_ID.fullmatch(kernel_id)
    if match is None:
        return None
    pairs = [item.split("=") for item in match.group(2).split(",")]
    return match.group(1), {name: int(value) for name, value in pairs}


@dataclass(frozen=True)
class Tunable:
    spec: KernelSpec  # capabilities shared by every configuration; registered as the default configuration
    params: dict[str, tuple[int, ...]]  # every value the kernel accepts, per parameter, in id order
    default: dict[str, int]
    build: Callable[[dict[str, int]], Callable] = field(repr=False, compare=False)  # config -> impl

    def __post_init__(self):
        self.check(self.default)

    @property
    def base_id(self) -> str:
        return self.spec.kernel_id

    def check(self, config: dict[str, int]) -> None:
        """ValueError unless config sets every parameter, in order, to a declared value."""
        if list(config) != list(self.params):
            raise ValueError(f"{self.base_id} takes parameters {list(self.params)}, got {list(config)}")
        for name, value in config.items():
            if value not in self.params[name]:
                raise ValueError(f"{self.base_id}: {name}={value} is not one of {list(self.params[name])}")

    def configured(self, config: dict[str, int]) -> KernelSpec:
        self.check(config)
        kernel_id = config_id(self.base_id, config)
        return dataclasses.replace(self.spec, kernel_id=kernel_id, impl=self.build(dict(config)),
                                   notes=f"{self.base_id} at {kernel_id[len(self.base_id):]}")

    def data(self) -> dict:
        return {"spec": self.spec.data(), "params": {k: list(v) for k, v in self.params.items()},
                "default": self.default}
