"""runtime_loader: replay an lzsolve dispatch table at server start.

    d = runtime_loader.load("artifacts/llama3-70b/<hw>")
    out = d.attention(q, k, v, causal=True)

    with runtime_loader.record("workload.json"):   # what a real run calls, for `tune --workload`
        serve_some_requests()

Imports torch only (kernel libraries lazily, through the registry); never
imports lzsolve, pandas, pyarrow, duckdb or optuna.
"""
from __future__ import annotations

import tarfile
import warnings
from pathlib import Path

import torch

from . import jit
from .dispatcher import Dispatcher
from .hardware import hardware_signature, mismatches
from .manifest import read_manifest, read_verified, verify
from .policies import Policy, PolicyError, current_policy, policy
from .record import record
from .table import MAX_TABLE_BYTES, Table, TableError, table_from_bytes

__all__ = ["Dispatcher", "Policy", "TableError", "load", "policy", "record"]


def _open(folder: Path, restore_jit: bool, jit_dir: Path | None) -> Table:
    manifest = read_manifest(folder)
    table = table_from_bytes(read_verified(folder, manifest, "dispatch.json", MAX_TABLE_BYTES),
                             str(folder / "dispatch.json"))
    device = table.hardware["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise TableError("table was tuned on CUDA but no CUDA device is available here")
    wrong = mismatches(table.hardware, hardware_signature("cuda" if device == "cuda" else "cpu"))
    if wrong:
        raise TableError(f"hardware or software stack differs ({'; '.join(wrong)})")
    if table.jit:
        archive = verify(folder, manifest, table.jit["archive"], jit.MAX_ARCHIVE_FILE_BYTES)
        jit.check_members(archive)  # refuse a hostile archive even when not restoring it
        if restore_jit:
            jit.restore(archive, manifest["files"][table.jit["archive"]]["sha256"], jit_dir)
    return table


# What reading hostile data can raise besides TableError (every reader maps the ones it expects;
# this is the net under them): a server's start must see a warning, never one of these.
DATA_ERRORS = (OSError, EOFError, ValueError, TypeError, KeyError, RecursionError, MemoryError, tarfile.TarError)


def _read(folder: Path, restore_jit: bool, jit_dir: Path | None) -> Table:
    """_open, with any error reading the artifact raised as TableError."""
    try:
        return _open(folder, restore_jit, jit_dir)
    except TableError:
        raise
    except DATA_ERRORS as e:
        raise TableError(f"unreadable artifact ({type(e).__name__}: {str(e)[:200]})") from None


def load(path: str | Path, *, strict: bool = False, restore_jit: bool = False, warmup: bool = False,
         jit_dir: str | Path | None = None, disable: bool = False, avoid=(), lock: dict | None = None) -> Dispatcher:
    """Validate the artifact at `path` (its folder, or its dispatch.json) and return a
    Dispatcher replaying it.

    Checks, in order: manifest checksums, dispatch.json against its JSON Schema, every
    kernel id against this runtime's registry, the hardware and software signature, and
    the jit/ archive's members. Files are read only when they are regular files inside the
    folder and within their size limits (README: "load treats the artifact as hostile data").
    A table that fails any check, or cannot be decoded at all, gives one warning and a
    dispatcher whose every call uses the fallback; with strict=True it raises TableError.

    restore_jit=True extracts the artifact's JIT caches (to jit_dir, default
    ~/.cache/lzsolve/jit) and points Triton, Inductor and FlashInfer at them; this runs
    compiled code the tuning run produced, so use it for artifacts you built.
    warmup=True calls every table entry once now, so the first request compiles nothing.

    Policy (README "Operator controls"): disable=True sends every call to the fallback, avoid
    names libraries whose kernels are not used, lock maps ops to the kernel that serves them; these
    add to LZSOLVE_DISABLE, LZSOLVE_AVOID and LZSOLVE_LOCK (ignored inside `runtime_loader.policy`).
    With strict=False a table kernel that raises on a call is replaced (Dispatcher's circuit
    breaker); strict=True also lets such errors, and a lock that cannot be honoured, raise.
    """
    path = Path(path)
    folder = path.parent if path.name == "dispatch.json" else path
    try:
        chosen = current_policy().merged(disable, avoid, lock)
    except PolicyError as e:
        if strict:
            raise TableError(f"policy: {e}") from None
        warnings.warn(f"lzsolve: policy ignored: {e}", RuntimeWarning, stacklevel=2)
        chosen = Policy().merged(disable, avoid, lock)
    try:
        dispatcher = Dispatcher(_read(folder, restore_jit, Path(jit_dir) if jit_dir else None), strict=strict,
                                policy=chosen)
        if warmup:
            dispatcher.warmup(strict=strict)
        return dispatcher
    except TableError as e:
        if strict:
            raise
        warnings.warn(f"lzsolve: not using dispatch table {path}: {e}; every call uses the fallback",
                      RuntimeWarning, stacklevel=2)
        return Dispatcher(None, policy=chosen)
