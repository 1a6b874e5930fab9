"""Input files read within bounds: a path a user names (manifests, profiles, components, a
model config, a CA bundle, a netrc) is a regular file of at most its limit, or a one-line
input error (exit 2) before a byte is read.

Why not `path.read_text()`: a character device (/dev/zero) has no size to check and never
ends (issue #46: 23.7 GB, then the kernel's OOM killer); a FIFO blocks the open itself until
a writer comes (`list` hung); a directory fails late with an errno. So: `stat` the path and
refuse anything but a regular file without opening it (opening some devices has effects);
open it non-blocking (should the path be swapped for a FIFO in between, the open still
returns); `fstat` the open descriptor, which is what is read, and check again; then read at
most limit + 1 bytes, so a file that grows past its limit while read is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mtpimage.errors import InputError

KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def _refuse_unless_regular(st: os.stat_result, display: str, what: str, limit: int, fix: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputError(
            display,
            None,
            f"is {_kind(st.st_mode)}, not a regular file; nothing was read",
            f"{what} must be a regular file",
        )
    if st.st_size > limit:
        raise InputError(display, None, f"{st.st_size} bytes; {what} may have at most {limit}", fix)


def check(
    path: Path, limit: int, what: str, display: str | None = None, fix: str = "pass the right file"
) -> None:
    """Refuse `path` unless it is a regular file of at most `limit` bytes (for paths another
    program reads: a CA bundle or netrc handed to the build as a secret). Nothing is opened."""
    display = display or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(display, None, f"file not found ({what})", "check the path") from None
    except OSError as exc:
        raise InputError(display, None, f"cannot read ({exc.strerror or exc})", fix) from None
    _refuse_unless_regular(st, display, what, limit, fix)


def read_bytes(
    path: Path, limit: int, what: str, display: str | None = None, fix: str = "pass the right file"
) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes; else InputError (exit 2),
    before any byte is read. `what` names the input in the error ("a manifest")."""
    display = display or str(path)
    check(path, limit, what, display, fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(display, None, f"cannot read ({exc.strerror or exc})", fix) from None
    try:
        _refuse_unless_regular(os.fstat(fd), display, what, limit, fix)  # what was opened
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InputError(display, None, f"cannot read ({exc.strerror or exc})", fix) from None
    finally:
        os.close(fd)
    if size > limit:
        raise InputError(display, None, f"grew past {limit} bytes while read ({what})", "pass the right file")
    return b"".join(chunks)


def read_text(
    path: Path, limit: int, what: str, display: str | None = None, fix: str = "pass the right file"
) -> str:
    display = display or str(path)
    data = read_bytes(path, limit, what, display, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(display, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})", fix) from None
