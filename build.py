#!/usr/bin/env python3
"""Entry point: `python3 build.py --profile mtp-cp-recompute`. See README.md.

On a fresh machine the pinned dependencies (requirements.txt) may be missing; then
this file makes ./.venv once, installs them there and re-runs itself inside it, so
the README's one command is all a user types. Later runs with the same Python find
every pin of requirements.txt installed in .venv/ (a directory listing, no pip) and
re-run inside it at once; pip runs again only when a pin is missing there.
"""

import importlib.util
import sys

# A remembered no-op answers here, before anything else is imported or looked for
# (mtpimage/assembly/fastpath.py: standard library only; any changed input misses).
from mtpimage import settings
from mtpimage.assembly import fastpath

# find_spec, not import: importing them costs time on every run.
REQUIRED = ("jinja2", "jsonschema", "packaging", "requests", "tenacity", "yaml")
# An interpreter without them re-runs this file inside .venv/ (below), whose look-up is the one
# that answers: asked here too, under this interpreter's key, it could only miss (and with
# MTP_FASTPATH_TRACE say so, before the .venv run's hit).
_has_deps = all(importlib.util.find_spec(name) for name in REQUIRED)
_reply, _key = fastpath.lookup(sys.argv[1:]) if __name__ == "__main__" and _has_deps else (None, None)
if _reply is not None:
    try:
        fastpath.replay(_reply)
    except BrokenPipeError:  # `| head` read enough: stop quietly, as standard tools do
        from mtpimage.errors import quiet_exit_for_gone_reader

        sys.exit(quiet_exit_for_gone_reader())
    sys.exit(0)

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _missing_pins() -> list[str]:
    """The `name==version` lines of requirements.txt that .venv/ does not hold, read from
    its site-packages' *.dist-info directories (no interpreter start, no pip). A line this
    cannot read counts as missing, so pip decides."""
    installed: set[tuple[str, str]] = set()
    for site in VENV.glob("lib/python*/site-packages"):
        for info in site.glob("*.dist-info"):
            name, _, version = info.name[: -len(".dist-info")].partition("-")
            installed.add((_canonical(name), version))
    missing = []
    try:
        lines = (HERE / "requirements.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ["requirements.txt (unreadable)"]
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if m is None or (_canonical(m.group(1)), m.group(2)) not in installed:
            missing.append(line)
    return missing


def _reexec(python: Path) -> None:
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


def _bootstrap() -> None:
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve() or settings.current().no_bootstrap:
        print("error: missing Python dependencies; run: pip install -r requirements.txt", file=sys.stderr)
        sys.exit(3)
    missing = _missing_pins() if python.exists() else ["(no .venv/ yet)"]
    if not missing:
        try:
            _reexec(python)  # .venv/ already holds every pin: no pip, no message
        except OSError:
            missing = [f"(cannot run {python})"]
    why = (
        "first run"
        if missing == ["(no .venv/ yet)"]
        else f"it lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
    )
    if not python.exists() and importlib.util.find_spec("ensurepip") is None:
        # stock Debian/Ubuntu python3 has no venv support until python3-venv is installed:
        # `-m venv` would leave a .venv/ without pip behind
        print(
            f"error: {sys.executable} cannot create .venv/: its venv module has no ensurepip "
            "(fix: apt-get install python3-venv, or pip install -r requirements.txt yourself)",
            file=sys.stderr,
        )
        sys.exit(3)
    print(f"build.py: installing pinned dependencies into {VENV.name}/ ({why})", file=sys.stderr)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
                str(HERE / "requirements.txt"),
            ],
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        print(
            f"error: could not install dependencies into {VENV.name}/: {exc} "
            "(fix: pip install -r requirements.txt)",
            file=sys.stderr,
        )
        sys.exit(3)
    _reexec(python)


if not _has_deps:
    _bootstrap()

from mtpimage.cli import invoke, main  # noqa: E402


def _main() -> int:
    if _key is None:
        return main()
    recorder = fastpath.Recorder()
    try:
        code, result = invoke()
    finally:
        recorder.stop()
    if code == 0 and not recorder.overflow:
        fastpath.remember(sys.argv[1:], _key, result, recorder.events)  # only a local JobResult
    return code


if __name__ == "__main__":
    sys.exit(_main())
