"""User-facing errors: one line each, naming the file, the line, the key and the fix.

Exit codes follow the CLI contract: 2 for bad input (manifests, flags), 1 for a
check that ran and failed (rules, tests), 3 for an environment problem (docker,
network) that is not the user's input. Three environment problems have codes of their own,
because each has its own fix and a script may act on it: 4 a registry refused this
machine's credentials (log in), 5 this machine's disk failed a write (free space), 6 bytes a
registry served cannot be decoded as what they claim to be (the image, not the network).
"""

from __future__ import annotations

import errno
import os
import re

EXIT_RULES = 1
EXIT_INPUT = 2
EXIT_ENV = 3
EXIT_AUTH = 4
EXIT_DISK = 5
EXIT_DECODE = 6


def last_words(text: str, width: int) -> str:
    """The end of a tool's message (where it says why), at most `width` characters, cut at a
    word and marked, never inside one: "... registry answered HTTP 500", not "egistry ..."."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    return "... " + text[-width:].split(" ", 1)[-1]


class BuilderError(Exception):
    exit_code = EXIT_ENV

    def one_line(self) -> str:
        """The error as one line, with the user and password of any URL in it redacted (a
        mirror's URL may carry a token: mirrors.py)."""
        return redact(" ".join(str(self).split()))


_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/\s@'\"]+)@")


def redact(text: str) -> str:
    """`text` with the user and password of every URL in it replaced by `****` (a mirror's
    token must never reach a log, an error line or the terminal). Here, below every module
    that prints, so that errors, the build's output (engine) and mirrors.py share it."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}****@", text or "")


class InputError(BuilderError):
    """Bad manifest, profile or flag. `where` is 'file[:line]' or '--set'."""

    exit_code = EXIT_INPUT

    def __init__(self, where: str, key: str | None, problem: str, fix: str | None = None):
        self.where, self.key, self.problem, self.fix = where, key, problem, fix
        parts = [where]
        if key:
            parts.append(key)
        text = ": ".join(parts) + ": " + problem
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)


class EnvironmentProblem(BuilderError):
    exit_code = EXIT_ENV


class DiskProblem(EnvironmentProblem):
    """Writing or reading a scratch file on this machine failed (a full disk, permissions):
    never reported as the network's fault."""

    exit_code = EXIT_DISK

    def __init__(self, what: str, path: object, exc: OSError, room: str = ""):
        where = f" to {path}" if isinstance(path, str) and path else ""
        room = room or "the temporary directory (TMPDIR) and MTP_CACHE_DIR"
        super().__init__(
            f"this machine's disk failed while {what}: writing{where} gave {exc.strerror or exc} "
            f"(fix: free space in {room}, or check their permissions, then run again)"
        )


def full_disk(stderr: str) -> OSError | None:
    """The OSError a tool's message reports when this machine ran out of space (buildah and
    dockerd say it in Go's words), else None: a full disk is exit 5, not the tool's fault. A
    registry's full disk does not reach its client (it answers HTTP 500 "unknown error")."""
    if "no space left on device" in stderr.lower():
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


class DecodeProblem(EnvironmentProblem):
    """Bytes that arrived whole (their digest checked) but cannot be read as what they say
    they are: a corrupt gzip stream, a layer that is not a tar. Retrying gets the same bytes."""

    exit_code = EXIT_DECODE


# 128 + SIGPIPE: how a standard tool ends when the reader of its output went away (`| head`)
EXIT_PIPE = 141


def stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reader has closed it: a BrokenPipeError then came
    from our own output, not from a socket or a subprocess's pipe."""
    import select
    import sys

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def quiet_exit_for_gone_reader() -> int:
    """Stop as standard tools do when `| head` has read enough: no message, exit 141. stdout
    goes to /dev/null so the interpreter's final flush does not complain either."""
    import os
    import sys

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass
    return EXIT_PIPE
