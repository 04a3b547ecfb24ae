"""Reading files that may be hostile: regular files only, size-limited, JSON depth-limited.

An artifact (or a config) is data someone else may have written. Opening a FIFO
blocks forever, a symlink to /dev/zero reads forever, a 200 MB JSON file costs
seconds and gigabytes, and JSON nested 100,000 deep exhausts the stack. Every
function here checks first (lstat, then fstat of what was opened, then the size)
and raises `error` (the caller's one-line error class: TableError in the runtime,
LzError in the CLI) with the reason, so nothing else escapes.

Messages that echo such data go through `shown` (one value) and `one_line` (a whole message):
a table key holding ESC clears the terminal that prints the warning, a newline forges a log
line, and a 3 MiB model_type is no message.

What this project writes for others to read (an artifact, a recorded workload) is written whole
by `write_whole`, with the modes the user's umask gives (0644 under 022): a server that runs as
another user than the tune reads it.
"""
from __future__ import annotations

import errno
import json
import os
import reprlib
import secrets
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

READ_BLOCK = 1 << 20
SHOWN_CHARS = 80  # of one echoed value: enough to recognise it, never a screenful
MESSAGE_CHARS = 2000  # of a whole one-line error; its tail (the fix) is kept


def printable(text: str) -> str:
    """`text` with every character that is not printable (control characters, ESC, newlines, line
    separators) escaped as repr escapes it: '\\x1b', '\\n', '\\u2028'."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


_SHORT = reprlib.Repr()  # a repr that stops early: a few items of a container, a few levels
_SHORT.maxstring = _SHORT.maxother = SHOWN_CHARS
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = _SHORT.maxfrozenset = 8
_SHORT.maxlevel = 3


def shown(value) -> str:
    """`value` as an error message may echo it: its repr (quoted and escaped), cut to about
    SHOWN_CHARS characters (a string's full length said), a container's first items."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value):,} characters)"
    return printable(_SHORT.repr(value))


def one_line(message: str, limit: int = MESSAGE_CHARS) -> str:
    """A message for one line of a log or terminal: escaped (printable), and when longer than
    `limit` its head and its tail (where the fix is said) around a cut."""
    text = printable(str(message))
    if len(text) <= limit:
        return text
    tail = limit // 4
    return f"{text[:limit - tail]} [...{len(text) - limit:,} characters cut...] {text[-tail:]}"


def warn(message: str, stacklevel: int = 1) -> None:
    """A RuntimeWarning for the user (a server's log), through one_line: warnings echo what an
    artifact, a policy variable or a library said. stacklevel as warnings.warn's, from the caller."""
    warnings.warn(one_line(message), RuntimeWarning, stacklevel=stacklevel + 1)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: Path, root: Path, error: type[Exception]) -> Path:
    """`path` with every symlink resolved, refused when that leaves `root`."""
    try:
        resolved = path.resolve(strict=True)
        top = root.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop
        raise error(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if resolved != top and top not in resolved.parents:
        raise error(f"{path} is a link to {resolved}, outside {root}")
    return resolved


def open_regular(path: str | Path, max_bytes: int, error: type[Exception], root: Path | None = None,
                 what: str | None = None) -> tuple[BinaryIO, int]:
    """(binary file, size) of `path`, after checking it is a regular file (inside `root` once every
    symlink is resolved, when `root` is given) of at most `max_bytes`. The open never blocks: a
    FIFO swapped in after the check opens non-blocking and fails the fstat check."""
    path = Path(path)
    what = what or str(path)
    target = _inside(path, root, error) if root is not None else path
    try:
        before = os.stat(target)
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(before.st_mode):
        raise error(f"{what} is {_kind(before.st_mode)}, not a regular file")
    if before.st_size > max_bytes:
        raise error(f"{what} is {before.st_size:,} bytes, over the {max_bytes:,}-byte limit")
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise error(f"cannot read {what}: {e.strerror or e}") from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode) or opened.st_size > max_bytes:
        os.close(fd)
        raise error(f"{what} changed while it was opened; not reading it")
    return os.fdopen(fd, "rb"), opened.st_size


def read_regular(path: str | Path, max_bytes: int, error: type[Exception], root: Path | None = None,
                 what: str | None = None) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (see open_regular); a file that grows
    past the limit while it is read is refused too."""
    what = what or str(path)
    f, _ = open_regular(path, max_bytes, error, root, what)
    with f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"cannot read {what}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise error(f"{what} grew past the {max_bytes:,}-byte limit while it was read")
    return data


def json_depth(value, limit: int) -> int:
    """Nesting depth of JSON-like data, counted without recursion and stopping past `limit`
    (so a hostile document can neither exhaust the stack nor make a recursive walk exponential)."""
    depth, level = 0, [value]
    seen: set[int] = set()
    while level and depth <= limit:
        depth += 1
        nxt = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
            for child in children:
                if isinstance(child, (dict, list)) and id(child) not in seen:
                    seen.add(id(child))
                    nxt.append(child)
        level = nxt
    return depth


def parse_json(data: bytes, max_depth: int, error: type[Exception], what: str, max_values: int | None = None):
    """JSON from UTF-8 bytes, nested at most `max_depth` deep and, when `max_values` is given,
    holding at most that many values, counted before anything is decoded as the bytes that open an
    object or array or separate two items (strings' included: an upper bound). What decoding and
    checking cost grows with the values, not the bytes: 8 MiB of `[{},{},...]` are 2.8 million
    objects. Every decoding failure (bad UTF-8, bad syntax, nesting past the interpreter's stack,
    memory) is `error`."""
    if max_values is not None:
        values = 1 + data.count(b"{") + data.count(b"[") + data.count(b",")
        if values > max_values:
            raise error(f"{what} holds up to {values:,} JSON values, over the {max_values:,} it may")
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as e:  # ValueError: bad UTF-8 or syntax, huge ints
        raise error(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if json_depth(value, max_depth) > max_depth:
        raise error(f"{what} is nested deeper than {max_depth} levels")
    return value


def read_json(path: str | Path, max_bytes: int, max_depth: int, error: type[Exception], root: Path | None = None,
              what: str | None = None):
    """read_regular, then parse_json."""
    what = what or str(path)
    return parse_json(read_regular(path, max_bytes, error, root, what), max_depth, error, what)


def write_whole(path: str | Path, data: bytes) -> None:
    """Write `data` to a new file beside `path`, fsync it, then rename it over `path`: a reader
    sees the old file or the new one, never half of one. The file is created as open() creates
    one, 0666 less the umask, not 0600 as tempfile.mkstemp does: under umask 022 another user
    (the server's) can read it. A failed write (a full disk) raises its OSError and leaves `path`
    as it was and no temporary file. A path that is something other than a file (a device such as
    /dev/null, a pipe, a folder) is refused with FileExistsError: the rename would replace it."""
    path = Path(path)
    try:
        kind = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        raise FileExistsError(errno.EEXIST, "exists and is not a regular file (a device, pipe or folder), which "
                                            "writing whole would replace; name a file", str(path))
    fd, tmp = _new_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_beside(path: Path) -> tuple[int, Path]:
    """(descriptor, path) of a file created beside `path` under a name no one else holds
    (".<name>.<random>.tmp": hidden, so no manifest lists it)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:  # 48 random bits taken: draw again
            continue
