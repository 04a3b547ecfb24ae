"""JIT caches: where each library keeps compiled kernels, and how an artifact carries them.

During tuning every library writes its cache under a folder owned by the run
(point_caches); the packer tars the caches the table's kernels declare into
jit/ as a plain tar. At load, `restore` extracts that archive (after checking
it is a plain tar within its size limits, and every member: no absolute paths,
no '..', no links, regular files only) and points the libraries at it, so a
server's first call finds its kernels compiled.

Restoring runs compiled code from the artifact (Triton binaries, Inductor's
generated modules and cache entries, which those libraries load themselves), so
it is opt-in: use it for artifacts you built, whose checksums the manifest
verifies. lzsolve itself never imports or unpickles anything from an artifact.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from . import safeio
from .manifest import MAX_FILE_BYTES
from .safeio import shown
from .table import TableError

# cache kind -> the environment variable its library reads (lazily, at first compile;
# FlashInfer reads its own at import, which its adapter defers to the first call).
JIT_CACHES = {
    "triton": "TRITON_CACHE_DIR",
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
    "flashinfer": "FLASHINFER_WORKSPACE_BASE",
}
# What a restore needs of a cache, where that is less than all of it. A restored FlashInfer loads
# each op from its AOT folder as cached_ops/<name>/<name>.so, without ninja (kernels/flashinfer.
# _flashinfer); its object files, generated sources and build files are the build's leftovers,
# and were most of the 40 MiB it took in an H100 artifact (BENCHMARKS §14).
RESTORED_FILES = {"flashinfer": ("*.so",)}
# Caches whose entries nvcc builds, a module at a time: tens of seconds per module, where a Triton
# or Inductor compile takes about a second. The tuner builds these ahead (lzsolve.ahead).
NVCC_BUILT = frozenset({"flashinfer"})
MAX_ARCHIVE_FILE_BYTES = MAX_FILE_BYTES  # the tar itself (a real one: 72 MB)
MAX_ARCHIVE_BYTES = 8 << 30  # what its members unpack to
MAX_ARCHIVE_MEMBERS = 200_000  # past this, listing the members alone takes seconds
DEFAULT_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lzsolve" / "jit"


def point_caches(root: Path, kinds=JIT_CACHES) -> None:
    """Send each library's JIT cache to root/<kind> (in this process and its children)."""
    for kind in kinds:
        folder = Path(root) / kind
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[JIT_CACHES[kind]] = str(folder.resolve())


def _open_tar(archive: Path) -> tarfile.TarFile:
    """The archive as a plain (uncompressed) tar, as `pack` writes it: a compressed one could
    unpack to terabytes before its first member is checked, so it is refused."""
    f, _ = safeio.open_regular(archive, MAX_ARCHIVE_FILE_BYTES, TableError, what=f"jit archive {archive.name}")
    try:
        return tarfile.open(fileobj=f, mode="r:")
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        f.close()
        raise TableError(f"jit archive {archive.name} is not a plain tar ({e})") from None


BLOCK = tarfile.BLOCKSIZE


def _count_headers(f, name: str) -> int:
    """The header blocks of a plain tar, counted by reading each one's size field alone (a
    microsecond each, where tarfile's parse of a member takes 20-40: 200,000 members took it 4-9 s),
    up to MAX_ARCHIVE_MEMBERS + 1; TableError unless the archive ends with its end-of-archive block.
    tarfile itself takes a header cut short, or no end block, for the end and keeps what came
    before: a truncated archive would pass, and restore partially. An extended (pax, GNU long
    name) header counts as one more member: an upper bound."""
    count, offset = 0, 0
    while count <= MAX_ARCHIVE_MEMBERS:
        f.seek(offset)
        header = f.read(BLOCK)
        if header == bytes(BLOCK):
            return count
        if len(header) < BLOCK:
            where = "inside a member's header" if header else "before its end-of-archive block"
            raise TableError(f"jit archive {name} is truncated (cut {where})")
        field = header[124:136]
        try:  # octal, or base-256 (a leading 0x80) for sizes past 8 GiB
            size = int.from_bytes(field[1:], "big") if field[0] & 0x80 else int(field.rstrip(b"\0 ") or b"0", 8)
        except ValueError:
            raise TableError(f"jit archive {name} is not a plain tar (a bad header at byte {offset:,})") from None
        offset += BLOCK + -(-size // BLOCK) * BLOCK
        count += 1
    raise TableError(f"jit archive {name} has over {MAX_ARCHIVE_MEMBERS:,} members")


def check_members(archive: Path) -> list[tarfile.TarInfo]:
    """Every member of a jit archive, or TableError for the first one that is not plain data."""
    members = []
    tar = _open_tar(archive)
    try:
        with tar, tar.fileobj:
            _count_headers(tar.fileobj, archive.name)  # bounds and checks the walk below
            for m in tar:
                members.append(m)
                if len(members) > MAX_ARCHIVE_MEMBERS:  # the file grew since it was counted
                    raise TableError(f"jit archive {archive.name} has over {MAX_ARCHIVE_MEMBERS:,} members")
    except TableError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # truncated or corrupt
        raise TableError(f"jit archive {archive.name} cannot be read ({type(e).__name__}: {e})") from None
    total = 0
    for m in members:
        path = PurePosixPath(m.name)
        if path.is_absolute() or m.name.startswith(("/", "\\")):
            raise TableError(f"jit archive member {shown(m.name)} has an absolute path")
        if ".." in path.parts:
            raise TableError(f"jit archive member {shown(m.name)} climbs out with '..'")
        if m.issym() or m.islnk():
            raise TableError(f"jit archive member {shown(m.name)} is a link ({shown(m.linkname)})")
        if not (m.isfile() or m.isdir()) or m.issparse():
            raise TableError(f"jit archive member {shown(m.name)} is not a regular file or folder")
        if path.parts and path.parts[0] not in JIT_CACHES:
            raise TableError(f"jit archive member {shown(m.name)} is outside the known caches {sorted(JIT_CACHES)}")
        total += m.size
    if total > MAX_ARCHIVE_BYTES:
        raise TableError(f"jit archive unpacks to {total >> 20} MiB, over the {MAX_ARCHIVE_BYTES >> 30} GiB limit")
    return members


def restore(archive: Path, digest: str, root: Path | None = None) -> Path:
    """Extract a checked archive into root/<digest> (once; atomically) and point the caches there."""
    members = check_members(archive)
    target = Path(root or DEFAULT_ROOT) / digest[:24]
    if not (target / ".complete").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
        try:
            with _open_tar(archive) as tar, tar.fileobj:
                for m in members:  # each already checked; the data filter is a second guard
                    if hasattr(tarfile, "data_filter"):
                        tar.extract(m, staging, filter="data")
                    else:
                        tar.extract(m, staging)
            _relocate_triton_groups(staging, target)
            (staging / ".complete").write_text("")
            if not (target / ".complete").exists():  # another process may have won the race
                shutil.rmtree(target, ignore_errors=True)
                try:
                    staging.rename(target)
                except OSError:
                    if not (target / ".complete").exists():
                        raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    kinds = sorted({PurePosixPath(m.name).parts[0] for m in members if PurePosixPath(m.name).parts})
    point_caches(target, kinds)
    if "flashinfer" in kinds:  # load its ops as prebuilt (see kernels/flashinfer._flashinfer)
        from .kernels.flashinfer import PREBUILT_ENV
        os.environ[PREBUILT_ENV] = "1"
    return target


def _relocate_triton_groups(staging: Path, target: Path) -> None:
    """Point every Triton cache group at its restored files. A group (__grp__<kernel>.json, Triton's
    own caches and Inductor's) names its files by the absolute paths where the tuning run compiled
    them; Triton takes a group whose files are not there for a miss and compiles the kernel again
    (seen with triton 3.9 on a moved cache). Its files share its folder, so each name maps to
    that folder in `target`, where the staging folder lands."""
    for group in staging.rglob("__grp__*.json"):
        if group.is_symlink() or not group.is_file():
            continue
        try:
            data = safeio.read_json(group, 1 << 20, 4, TableError)
        except TableError:
            continue  # Triton takes a group it cannot read for a miss, as it would have anyway
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            continue
        folder = target / group.parent.relative_to(staging)
        data["child_paths"] = {name: str(folder / name) for name in children
                               if isinstance(name, str) and name == PurePosixPath(name).name and name not in ("", ".", "..")}
        group.write_text(json.dumps(data))


def written_since(kinds, since: float) -> list[str]:
    """The files ('kind/relative/path') of the caches `kinds`, where this process points them, written
    at or after `since` (time.time()): what a kernel's first call compiled, so that an artifact
    can carry its own kernels' entries rather than whole caches."""
    files = []
    for kind in kinds:
        root = os.environ.get(JIT_CACHES[kind])
        if not root or not os.path.isdir(root):
            continue
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if not os.path.islink(path) and os.stat(path).st_mtime >= since:
                        files.append(f"{kind}/{Path(os.path.relpath(path, root)).as_posix()}")
                except OSError:  # removed while we walked (a lock file)
                    continue
    return sorted(files)


def pack(root: Path, kinds, archive: Path, files: dict[str, list[str]] | None = None) -> list[str]:
    """Tar the non-empty caches `kinds` under `root` into `archive`; returns the kinds packed. A kind
    named in `files` contributes those files alone ('kind/relative/path', where they still exist),
    any other kind the whole of its cache; of either, only what a restore needs (RESTORED_FILES)."""
    packed = []
    files = files or {}
    with tarfile.open(archive, "w") as tar:
        for kind in sorted(set(kinds)):
            if kind in files:
                chosen = [f for f in sorted(set(files[kind])) if _cache_file(root, kind, f)]
            else:
                folder = Path(root) / kind
                chosen = sorted(f"{kind}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*")
                                if p.is_file() and not p.is_symlink()) if folder.is_dir() else []
            chosen = [f for f in chosen if _needed_on_restore(kind, f)]
            for f in chosen:
                tar.add(Path(root) / f, arcname=f, filter=_plain_files_only)
            if chosen:
                packed.append(kind)
    return packed


def _needed_on_restore(kind: str, name: str) -> bool:
    patterns = RESTORED_FILES.get(kind)
    return patterns is None or any(PurePosixPath(name).match(p) for p in patterns)


def _cache_file(root: Path, kind: str, name: str) -> bool:
    """`name` ('kind/...', read from a PerfDB) is a regular file inside root/kind, reached without
    '..' or links."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or path.parts[:1] != (kind,):
        return False
    full = Path(root) / name
    return full.is_file() and not full.is_symlink() and full.resolve().is_relative_to((Path(root) / kind).resolve())


def _plain_files_only(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Caches sometimes hold lock files as links or sockets: leave those out."""
    if not (info.isfile() or info.isdir()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
