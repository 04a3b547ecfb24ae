"""Errors a user can fix: the CLI prints the message on one line and exits non-zero."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from runtime_loader.safeio import one_line


class LzError(Exception):
    """Bad input or an unusable environment; the message names the problem and the fix, on one
    line (escaped and bounded: it may echo what the input held)."""

    def __init__(self, message: str = ""):
        super().__init__(one_line(message))


# errno values that mean the output's storage failed, not the input: the user frees space or
# fixes the disk, then re-runs (measured records are on disk already, in whole files).
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG}


class WriteError(Exception):
    """Writing an output file failed (disk full, quota, I/O error); `path` names the file."""

    def __init__(self, path: str | Path, cause: OSError):
        self.path, self.cause = Path(path), cause
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.cause.errno in (errno.ENOSPC, errno.EDQUOT):
            what = "no space left on device"
        else:  # "input/output error", "read-only file system", ...
            what = (self.cause.strerror or (os.strerror(self.cause.errno) if self.cause.errno else "I/O error")).lower()
        return f"{what} writing {self.path}; measured records are kept, re-run to continue"
