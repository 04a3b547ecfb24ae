"""manifest.json: the sha256 of every file of an artifact, checked before anything is used."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

from .table import TableError

MANIFEST = "manifest.json"


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
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except OSError:
        raise TableError(f"no {MANIFEST} in {folder}: cannot check the artifact's integrity") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TableError(f"{MANIFEST} is not valid JSON ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise TableError(f"{MANIFEST} has no 'files' object")
    return manifest


def verify(folder: Path, manifest: dict, rel: str) -> Path:
    """The path of `rel` inside the artifact, after checking its sha256 against the manifest."""
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or ".." in parts:
        raise TableError(f"artifact path {rel!r} leaves the artifact folder")
    entry = manifest["files"].get(rel)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise TableError(f"{MANIFEST} does not list {rel}")
    path = folder / rel
    try:
        actual = sha256_file(path)
    except OSError as e:
        raise TableError(f"cannot read {path}: {e.strerror or e}") from None
    if actual != entry["sha256"]:
        raise TableError(f"checksum mismatch for {rel}: the file changed after the artifact was written")
    return path
