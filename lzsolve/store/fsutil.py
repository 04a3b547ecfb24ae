"""Writing files so that a reader never sees half of one."""
from __future__ import annotations

from pathlib import Path

from lzsolve.errors import WriteError
from runtime_loader.safeio import write_whole


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """runtime_loader.safeio.write_whole (a temporary file beside `path`, fsync, rename; the
    umask's modes): a failed write (a full disk) leaves `path` as it was and no temporary file,
    and raises WriteError naming `path`."""
    try:
        write_whole(path, data)
    except OSError as e:
        raise WriteError(path, e) from e


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
