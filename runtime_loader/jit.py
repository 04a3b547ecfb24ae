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
# and were most of the 40 MiB it took in an H100 artifact (benchmarks/jit_restore.py).
RESTORED_FILES = {"flashinfer": ("*.so",)}
# Caches whose entries nvcc builds, a module at a time: tens of seconds per module, where a Triton
# or Inductor compile takes about a second. The tuner builds these ahead (lzsolve.measure.ahead).
NVCC_BUILT = frozenset({"flashinfer"})
MAX_ARCHIVE_FILE_BYTES = MAX_FILE_BYTES  # the tar itself (a real one: 72 MB)
MAX_ARCHIVE_BYTES = 8 << 30  # what its members unpack to
# Past this, checking the members at every load takes a large part of a second (0.14-0.17 s at the limit on a
# 2-core VM, 0.7-1.5 s at 200,000 under load). A real archive holds the table kernels' files: a few thousand.
MAX_ARCHIVE_MEMBERS = 50_000
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
MAX_EXTENDED_HEADER = 64 << 10  # a pax or GNU long-name header's data: a path, not a file
FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd


def _member_problem(name: str, kind: str, linkname: str = "", placed: dict[str, str] | None = None) -> str | None:
    """Why a member (its path, its tarfile type: "file", "dir", "link", "other") may not be
    extracted into the JIT caches, or None. One check for both readers of an archive (the
    headers' own walk, and tarfile's parse before extraction), so a name they read differently
    is checked as each reads it. Plain string tests: it runs on up to 200,000 members per load.
    placed: the earlier members' paths and kinds (_misplaced), which this one is added to."""
    parts = name.split("/")
    if name.startswith(("/", "\\")):
        return f"jit archive member {shown(name)} has an absolute path"
    if ".." in parts:
        return f"jit archive member {shown(name)} climbs out with '..'"
    if kind == "link":
        return f"jit archive member {shown(name)} is a link ({shown(linkname)})"
    if kind not in ("file", "dir"):
        return f"jit archive member {shown(name)} is not a regular file or folder"
    if parts[0] not in JIT_CACHES and parts[0] not in ("", "."):
        return f"jit archive member {shown(name)} is outside the known caches {sorted(JIT_CACHES)}"
    return _misplaced(name, kind, placed) if placed is not None else None


def _misplaced(name: str, kind: str, placed: dict[str, str]) -> str | None:
    """Why a file or folder cannot be extracted where the earlier members `placed` (path -> "file"
    or "dir", their folders included) put theirs: a file with no name (""), a member inside an earlier
    file, a file where a folder is or a folder where a file is (extraction failed on each with an
    IsADirectoryError or NotADirectoryError). Adds this member to `placed`."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts and kind == "file":
        return f"jit archive member {shown(name)} is a file with no name"
    for depth in range(1, len(parts)):
        folder = "/".join(parts[:depth])
        if placed.setdefault(folder, "dir") == "file":
            return f"jit archive member {shown(name)} is inside {shown(folder)}, an earlier file"
    path = "/".join(parts)
    if placed.setdefault(path, kind) != kind:
        return f"jit archive member {shown(name)} is a {kind} where an earlier member made a {placed[path]}"
    return None


def _header_kind(typeflag: bytes) -> str:
    if typeflag in FILE_TYPES:
        return "file"
    if typeflag == tarfile.DIRTYPE:
        return "dir"
    return "link" if typeflag in (tarfile.SYMTYPE, tarfile.LNKTYPE) else "other"


def _field(header: bytes, start: int, end: int) -> str:
    return header[start:end].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_paths(data: bytes) -> dict[str, str]:
    """A pax extended header's path and linkpath records ("<length> <key>=<value>\\n" each)."""
    found, offset = {}, 0
    while offset < len(data):
        length, _, rest = data[offset:offset + 20].partition(b" ")
        if not length.isdigit() or int(length) <= 0:
            raise ValueError("a bad pax record")
        record = data[offset:offset + int(length)]
        key, _, value = record[len(length) + 1:].rstrip(b"\n").partition(b"=")
        if key in (b"path", b"linkpath"):
            found[key.decode()] = value.decode("utf-8", "surrogateescape")
        offset += int(length)
    return found


def _walk_headers(f, name: str) -> int:
    """The members of a plain tar, read from their headers alone (a few microseconds each, where
    tarfile's parse takes 20-40: 200,000 members took it 4-9 s; not a member's data), each checked by _member_problem,
    up to MAX_ARCHIVE_MEMBERS, their sizes summed up to MAX_ARCHIVE_BYTES; returns their number.
    TableError unless the archive ends with its end-of-archive block: tarfile itself takes a header
    cut short, or no end block, for the end and keeps what came before, so a truncated archive
    would pass and restore partially. A pax or GNU long-name header names the member after it;
    it counts as a member too (an upper bound)."""
    count, offset, total, pending, placed = 0, 0, 0, {}, {}
    while count <= MAX_ARCHIVE_MEMBERS:
        f.seek(offset)
        header = f.read(BLOCK)
        if header == bytes(BLOCK):
            return count
        if not offset and not header:
            raise TableError(f"jit archive {name} is empty (0 bytes, where a tar holds at least its end block); "
                             "tune again to write it")
        if not offset and (len(header) < BLOCK or header.startswith(COMPRESSED)):
            raise TableError(f"jit archive {name} is not a plain tar (a compressed one could unpack to terabytes "
                             "before its first member is checked)")
        if len(header) < BLOCK:
            where = "inside a member's header" if header else "before its end-of-archive block"
            raise TableError(f"jit archive {name} is truncated (cut {where})")
        size_field, typeflag = header[124:136], header[156:157]
        try:
            # the first header's checksum (its bytes summed, the field itself as spaces), as tarfile
            # checks each: a gzip or other file is no tar (tarfile checks the rest before extracting)
            if not count and int(header[148:156].rstrip(b"\0 ") or b"-1", 8) != sum(header) - sum(header[148:156]) + 256:
                raise ValueError("a bad header checksum")
            # its size: octal, or base-256 (a leading 0x80) for sizes past 8 GiB
            size = (int.from_bytes(size_field[1:], "big") if size_field[0] & 0x80
                    else int(size_field.rstrip(b"\0 ") or b"0", 8))
            if typeflag in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                if size > MAX_EXTENDED_HEADER:
                    raise ValueError("an extended header past 64 KiB")
                data = f.read(size)
                if typeflag == tarfile.GNUTYPE_LONGNAME:
                    pending["path"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif typeflag == tarfile.GNUTYPE_LONGLINK:
                    pending["linkpath"] = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif typeflag == tarfile.XGLTYPE and _pax_paths(data):
                    raise ValueError("a global header naming a path")
                else:
                    pending.update(_pax_paths(data))
            else:
                member = pending.get("path") or _field(header, 0, 100)
                if "path" not in pending and header[345] and header[257:262] == b"ustar":  # a ustar name prefix
                    member = f"{_field(header, 345, 500)}/{member}"
                kind = _header_kind(typeflag)
                problem = _member_problem(member, kind, (pending.get("linkpath") or _field(header, 157, 257))
                                          if kind == "link" else "", placed)
                if problem:
                    raise TableError(problem)
                pending, total = {}, total + size
        except ValueError as e:
            raise TableError(f"jit archive {name} is not a plain tar ({e} at byte {offset:,})") from None
        if total > MAX_ARCHIVE_BYTES:
            raise TableError(f"jit archive unpacks to over {MAX_ARCHIVE_BYTES >> 30} GiB, the limit")
        offset += BLOCK + -(-size // BLOCK) * BLOCK
        count += 1
    raise TableError(f"jit archive {name} has over {MAX_ARCHIVE_MEMBERS:,} members")


def check_archive(archive: Path) -> int:
    """A jit archive checked from its headers (every load does this, restoring or not): TableError for
    one that is not a plain tar, is cut short, holds over MAX_ARCHIVE_MEMBERS members or unpacks past
    MAX_ARCHIVE_BYTES, or has a member _member_problem refuses. Returns the number of headers."""
    f, _ = safeio.open_regular(archive, MAX_ARCHIVE_FILE_BYTES, TableError, what=f"jit archive {archive.name}")
    with f:
        return _walk_headers(f, archive.name)


def check_members(archive: Path) -> list[tarfile.TarInfo]:
    """Every member of a jit archive as tarfile reads it (what restore extracts), after check_archive,
    each checked again as tarfile names it; TableError for the first that is not plain data."""
    check_archive(archive)
    members = []
    tar = _open_tar(archive)
    try:
        with tar, tar.fileobj:
            for m in tar:
                members.append(m)
                if len(members) > MAX_ARCHIVE_MEMBERS:  # the file grew since it was checked
                    raise TableError(f"jit archive {archive.name} has over {MAX_ARCHIVE_MEMBERS:,} members")
    except TableError:
        raise
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # truncated or corrupt
        raise TableError(f"jit archive {archive.name} cannot be read ({type(e).__name__}: {e})") from None
    total, placed = 0, {}
    for m in members:
        kind = ("file" if m.isfile() and not m.issparse() else "dir" if m.isdir()
                else "link" if m.issym() or m.islnk() else "other")
        problem = _member_problem(m.name, kind, m.linkname, placed)
        if problem:
            raise TableError(problem)
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
                chosen = [f for f in sorted(set(files[kind])) if cache_file(root, kind, f)]
            else:
                folder = Path(root) / kind
                chosen = sorted(f"{kind}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*")
                                if p.is_file() and not p.is_symlink()) if folder.is_dir() else []
            chosen = [f for f in chosen if needed_on_restore(kind, f)]
            for f in chosen:
                tar.add(Path(root) / f, arcname=f, filter=_plain_files_only)
            if chosen:
                packed.append(kind)
    return packed


def needed_on_restore(kind: str, name: str) -> bool:
    patterns = RESTORED_FILES.get(kind)
    return patterns is None or any(PurePosixPath(name).match(p) for p in patterns)


def cache_file(root: Path, kind: str, name: str) -> bool:
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
