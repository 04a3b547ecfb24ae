"""The JIT files of the measurement cache: what a record's first call compiled travels with it.

A tune's kernels compile into the run's own folder (`.jit-work`, runtime_loader.jit.point_caches),
and the artifact packs the files its chosen kernels' first calls wrote there. A record reused from
the measurement cache names a first call made in another run's folder: without this store, an
artifact solved from such records packed no JIT cache for those kernels (its server compiled them
at its first requests), and a tune that met such a kernel at a new shape built its module again
(an H100's workload tunes rebuilt FlashInfer's prefill modules, 33-48 s each, in every new folder:
benchmarks/runs/2026-12-06.txt).

So the cache keeps, per hardware signature, the files its records name (those a restore needs:
runtime_loader.jit.RESTORED_FILES), and a run copies those of its plan's kernels into its own
folder before it measures. A file name comes from a PerfDB, which is data: only a relative path
into a known cache kind is copied, and only a regular file (no link) inside the folder it is read from.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from runtime_loader.jit import JIT_CACHES, cache_file, needed_on_restore

STORE = "jit"  # the store's folder inside the measurement cache's


def store_root(cache: Path, hw_slug: str) -> Path:
    """Where the cache at `cache` keeps the JIT files of one hardware signature (hardware.slug)."""
    return Path(cache) / STORE / hw_slug


def named_files(records: Iterable[dict]) -> set[str]:
    """The cache files ('kind/relative/path') `records` name in their jit_files, of those a restore
    needs; names outside the known cache kinds are left out (copy_files refuses the rest: '..',
    absolute paths, links)."""
    names: set[str] = set()
    for record in records:
        try:
            listed = json.loads(record.get("jit_files") or "[]")
        except (TypeError, ValueError):
            continue
        for name in listed if isinstance(listed, list) else ():
            kind = name.split("/", 1)[0] if isinstance(name, str) else None
            if kind in JIT_CACHES and needed_on_restore(kind, name):
                names.add(name)
    return names


def copy_files(names: Iterable[str], source: Path, target: Path) -> int:
    """Copy each of `names` that is a regular file inside `source` (runtime_loader.jit.cache_file)
    and missing from `target`, each whole or not at all (a temporary file, then a rename, so that a
    second tuner copying the same file meanwhile finds it whole); returns how many were copied."""
    copied = 0
    for name in sorted(names):
        kind = name.split("/", 1)[0]
        if (Path(target) / name).exists() or not cache_file(Path(source), kind, name):
            continue
        _copy_whole(Path(source) / name, Path(target) / name)
        copied += 1
    return copied


def _copy_whole(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=".copy-", dir=target.parent)
    os.close(fd)
    try:
        shutil.copy2(source, temporary)  # its old mtime: a later first call's written_since leaves it out
        os.replace(temporary, target)
    finally:
        Path(temporary).unlink(missing_ok=True)
