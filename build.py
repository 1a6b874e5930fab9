#!/usr/bin/env python3
"""Entry point: `python build.py --profile mtp-cp-recompute`. See README.md.

On a fresh machine the pinned dependencies (requirements.txt) may be missing; then
this file makes ./.venv once, installs them there and re-runs itself inside it, so
the README's one command is all a user types.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"


def _bootstrap() -> None:
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve() or os.environ.get("MTP_NO_BOOTSTRAP"):
        print("error: missing Python dependencies; run: pip install -r requirements.txt",
              file=sys.stderr)
        sys.exit(3)
    print(f"build.py: installing pinned dependencies into {VENV.name}/ (first run only)",
          file=sys.stderr)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-r", str(HERE / "requirements.txt")], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"error: could not install dependencies into {VENV.name}/: {exc} "
              "(fix: pip install -r requirements.txt)", file=sys.stderr)
        sys.exit(3)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


# find_spec, not import: importing docker alone costs ~0.2 s on every run.
REQUIRED = ("docker", "jinja2", "jsonschema", "packaging", "requests", "tenacity",
            "testcontainers", "yaml")
if any(importlib.util.find_spec(name) is None for name in REQUIRED):
    _bootstrap()

from mtpimage.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
