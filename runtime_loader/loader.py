"""load(): an artifact folder, checked as hostile data, to a Dispatcher (or the fallback's,
with one warning, when any check fails)."""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

import torch

from . import jit
from .dispatcher import Dispatcher
from .hardware import Comparison, differences, hardware_signature
from .manifest import read_manifest, read_verified, verify
from .policies import PolicyError, current_policy
from .safeio import warn
from .table import MAX_TABLE_BYTES, Table, TableError, table_from_bytes


def _open(folder: Path, restore_jit: bool, jit_dir: Path | None, allow_similar_gpu: bool) -> tuple[Table, Comparison]:
    """The artifact's table and how this machine differs from where it was tuned. Another
    architecture is refused; another device model of the same one (an H100's table on an H200) is
    refused unless allow_similar_gpu; changed software is the Dispatcher's to judge, entry by entry."""
    if not folder.is_dir():
        raise TableError(f"no artifact folder at {folder}; pass the folder `lzsolve tune` wrote (it holds "
                         "dispatch.json and manifest.json)")
    manifest = read_manifest(folder)
    table = table_from_bytes(read_verified(folder, manifest, "dispatch.json", MAX_TABLE_BYTES),
                             str(folder / "dispatch.json"))
    device = table.hardware["device"]
    if device == "cuda" and not torch.cuda.is_available():
        raise TableError("table was tuned on CUDA but no CUDA device is available here")
    here = differences(table.hardware, hardware_signature("cuda" if device == "cuda" else "cpu"))
    if here.refused:
        raise TableError(f"tuned on another architecture ({'; '.join(here.refused)}); tune on this machine")
    if here.borrowed and not allow_similar_gpu:
        raise TableError(f"tuned on another device ({'; '.join(here.borrowed)}) of this architecture; "
                         "load(path, allow_similar_gpu=True) borrows it, and `lzsolve evaluate PATH --on-this-gpu` "
                         "measures what that costs here")
    if here.borrowed:
        warn(f"lzsolve: borrowing a table tuned on another device ({'; '.join(here.borrowed)}): its "
             "decisions were measured there; `lzsolve evaluate PATH --on-this-gpu` measures them here", stacklevel=4)
    if table.jit:
        archive = verify(folder, manifest, table.jit["archive"], jit.MAX_ARCHIVE_FILE_BYTES)
        jit.check_archive(archive)  # a hostile archive is refused even when not restored
        if restore_jit and here.stack:  # compiled against other libraries: built again here at first calls
            warn(f"lzsolve: JIT caches not restored: they were compiled under other software "
                 f"({', '.join(f'{k} {v[0]}' for k, v in here.stack.items())})", stacklevel=4)
        elif restore_jit:
            jit.restore(archive, manifest["files"][table.jit["archive"]]["sha256"], jit_dir)
    return table, here


# What reading hostile data can raise besides TableError (every reader maps the ones it expects;
# this is the net under them): a server's start must see a warning, never one of these.
DATA_ERRORS = (OSError, EOFError, ValueError, TypeError, KeyError, OverflowError, RecursionError, MemoryError,
               tarfile.TarError)


def _read(folder: Path, restore_jit: bool, jit_dir: Path | None, allow_similar_gpu: bool) -> tuple[Table, Comparison]:
    """_open, with any error reading the artifact raised as TableError."""
    try:
        return _open(folder, restore_jit, jit_dir, allow_similar_gpu)
    except TableError:
        raise
    except DATA_ERRORS as e:
        raise TableError(f"unreadable artifact ({type(e).__name__}: {str(e)[:200]})") from None


def load(path: str | Path, *, strict: bool = False, restore_jit: bool = False, warmup: bool = False,
         jit_dir: str | Path | None = None, disable: bool = False, avoid=(), lock: dict | None = None,
         verify: bool = False, allow_similar_gpu: bool = False) -> Dispatcher:
    """Validate the artifact at `path` (its folder, or its dispatch.json) and return a
    Dispatcher replaying it.

    Checks, in order: manifest checksums, dispatch.json against its JSON Schema, every
    kernel id against this runtime's registry, the hardware signature, and the jit/ archive's
    members. Files are read only when they are regular files inside the folder and within their
    size limits (README: "load treats the artifact as hostile data"). A table that fails any
    check, or cannot be decoded at all, gives one warning and a dispatcher whose every call uses
    the fallback (its load_error says why); with strict=True it raises TableError.

    A table tuned on another architecture is refused; on another device of the same
    architecture (an H100's on an H200) only with allow_similar_gpu=True, with one warning. Where
    the software changed since the tune (torch, CUDA, cuDNN, Triton, a kernel library, our adapter
    source), each entry whose kernels it changed uses the next ranked kernel or the fallback, and
    the others serve as tuned (d.explain() says which and why). verify=True checks the kernels
    kept against their ops' fallbacks on random inputs first, in bounded time, and drops any that
    disagree (Dispatcher.verify).

    restore_jit=True extracts the artifact's JIT caches (to jit_dir, default
    ~/.cache/lzsolve/jit) and points Triton, Inductor and FlashInfer at them; this runs
    compiled code the tuning run produced, so use it for artifacts you built (caches compiled
    under other software are not restored: the kernels compile again at their first calls).
    warmup=True calls every table entry once now, so the first request compiles nothing.

    Policy (README "Operator controls"): disable=True sends every call to the fallback, avoid
    names libraries whose kernels are not used, lock maps ops to the kernel that serves them; these
    add to LZSOLVE_DISABLE, LZSOLVE_AVOID and LZSOLVE_LOCK (ignored inside `runtime_loader.policy`).
    With strict=False a table kernel that raises on a call is replaced (Dispatcher's circuit
    breaker); strict=True also lets such errors, and a lock that cannot be honoured, raise.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load(path) got a {type(path).__name__}: pass the artifact's folder as a str or Path")
    path = Path(path)
    folder = path.parent if path.name == "dispatch.json" else path
    try:  # not strict: a malformed item is dropped alone, with a warning, and the rest applies
        chosen = current_policy(strict).merged(disable, avoid, lock)
    except PolicyError as e:
        raise TableError(f"policy: {e}") from None
    try:
        table, here = _read(folder, restore_jit, Path(jit_dir) if jit_dir else None, allow_similar_gpu)
        dispatcher = Dispatcher(table, strict=strict, policy=chosen, stack=here.stack)
        dropped = dispatcher.verify() if verify else {}
        if dropped and strict:
            raise TableError(f"verify: {len(dropped)} kernels disagree with their fallbacks: "
                             + "; ".join(f"{k}: {why}" for k, why in list(dropped.items())[:3]))
        if dropped:
            warn(f"lzsolve: verify dropped {len(dropped)} kernels ({'; '.join(list(dropped.values())[:3])}); "
                 "their entries use the next ranked kernel or the fallback", stacklevel=2)
        if warmup:
            dispatcher.warmup(strict=strict)
        return dispatcher
    except TableError as e:
        if strict:
            raise
        warn(f"lzsolve: not using dispatch table {path}: {e}; every call uses the fallback", stacklevel=2)
        return Dispatcher(None, policy=chosen, load_error=str(e))
