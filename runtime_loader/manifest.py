"""manifest.json: the sha256 of every file of an artifact, checked before anything is used.

Every file is read through safeio: a regular file inside the artifact folder (a FIFO, a
device or a symlink out of the folder is refused before it is opened), within its size limit.
"""
from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath

from . import safeio
from .table import TableError

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 4 << 20  # ~30,000 files' entries; a real artifact lists a few hundred
MAX_MANIFEST_DEPTH = 4  # {"files": {path: {"sha256": ..., "bytes": ...}}}
MAX_FILE_BYTES = 1 << 30  # no file `load` reads is larger (a real jit archive: 72 MB)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(folder: Path, skip_hidden: bool = True) -> dict:
    """Hash every file under `folder` (except the manifest itself and hidden work folders)."""
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST or not path.is_file() or (skip_hidden and any(p.startswith(".") for p in rel.split("/"))):
            continue
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return {"schema_version": 1, "files": files}


def read_manifest(folder: Path) -> dict:
    if not (folder / MANIFEST).exists() and not (folder / MANIFEST).is_symlink():
        raise TableError(f"no {MANIFEST} in {folder}: cannot check the artifact's integrity")
    manifest = safeio.read_json(folder / MANIFEST, MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH, TableError, root=folder,
                                what=MANIFEST)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise TableError(f"{MANIFEST} has no 'files' object")
    return manifest


def _checked_path(folder: Path, manifest: dict, rel: str) -> tuple[Path, str]:
    """The path of `rel` inside the artifact and the sha256 the manifest lists for it."""
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise TableError(f"artifact path {rel!r} leaves the artifact folder")
    entry = manifest["files"].get(rel)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise TableError(f"{MANIFEST} does not list {rel}")
    return folder / rel, entry["sha256"]


def _check_digest(rel: str, actual: str, expected: str) -> None:
    if actual != expected:
        raise TableError(f"checksum mismatch for {rel}: the file changed after the artifact was written")


def verify(folder: Path, manifest: dict, rel: str, max_bytes: int = MAX_FILE_BYTES) -> Path:
    """The path of `rel` inside the artifact, after checking its sha256 against the manifest
    (hashed as it streams: for files too large to hold in memory, such as the jit archive)."""
    path, expected = _checked_path(folder, manifest, rel)
    f, _ = safeio.open_regular(path, max_bytes, TableError, root=folder, what=rel)
    digest = hashlib.sha256()
    with f:
        try:
            for block in iter(lambda: f.read(safeio.READ_BLOCK), b""):
                digest.update(block)
        except OSError as e:
            raise TableError(f"cannot read {rel}: {e.strerror or e}") from None
    _check_digest(rel, digest.hexdigest(), expected)
    return path


def read_verified(folder: Path, manifest: dict, rel: str, max_bytes: int) -> bytes:
    """The bytes of `rel`, read once and checked against the manifest's sha256 (what is parsed
    is exactly what was hashed)."""
    path, expected = _checked_path(folder, manifest, rel)
    data = safeio.read_regular(path, max_bytes, TableError, root=folder, what=rel)
    _check_digest(rel, hashlib.sha256(data).hexdigest(), expected)
    return data
