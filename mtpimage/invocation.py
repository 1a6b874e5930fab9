"""How the user started the tool, for usage lines and the fix hints a user copies.

A hint that names `python` (not `python3`) fails on stock Debian 12, which has `python3` and no
`python` (README); one that says `build.py ...` fails from another folder. So a hint names the
console command when that is what ran, else `python3` and build.py's path from the folder the
command ran in. Generated files that outlive the run (a job script's header) say
`python3 build.py` (STATIC), so their bytes do not depend on who generated them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CONSOLE_COMMAND = "mtp-image-builder"  # pyproject.toml [project.scripts]
STATIC = "python3 build.py"


def shown_path(path: Path | str) -> str:
    """A path as the user can type it where the command ran: relative to the working folder
    when it is inside it, else absolute (a `../../` chain reads worse than the full path)."""
    try:
        here = os.path.abspath(os.getcwd())
    except OSError:  # the working folder was removed
        return str(path)
    full = os.path.abspath(path)
    try:
        return str(Path(full).relative_to(here))
    except ValueError:
        return full


def command() -> str:
    """`python3 build.py`, `python3 ../build.py` or `mtp-image-builder`: what to type here."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("")
    if argv0.name == CONSOLE_COMMAND:
        return CONSOLE_COMMAND
    if argv0.name == "build.py":
        return f"python3 {shown_path(argv0)}"
    return STATIC  # in-process callers (tests, cli.main from Python)
