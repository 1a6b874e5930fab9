"""User-facing errors: one line each, naming the file, the line, the key and the fix.

Exit codes follow the CLI contract: 2 for bad input (manifests, flags), 1 for a
check that ran and failed (rules, tests), 3 for an environment problem (docker,
network) that is not the user's input.
"""

from __future__ import annotations

import re

EXIT_RULES = 1
EXIT_INPUT = 2
EXIT_ENV = 3


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
