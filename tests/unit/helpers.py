"""Shared helpers for unit tests: run the CLI, copy and edit manifests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python build.py ARGS` as users do, in a separate process."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MTP_DEBUG", None)
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), *args],
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def run_main(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`build.py ARGS` in this process, through cli.main(argv), as cibuildwheel's tests do:
    the same exit status and streams as run_cli, without a Python start per call. For tests
    of what the CLI decides and prints; run_cli stays for what needs a process (build.py's
    fast path and bootstrap, signals, a reader that goes away)."""
    import contextlib
    import io

    from mtpimage import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    os.environ.pop("MTP_DEBUG", None)
    try:
        os.chdir(cwd or REPO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse's own exits (--help, a bad flag)
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["build.py", *args], code, out.getvalue(), err.getvalue())


def pin(component: str, field: str = "commit") -> str:
    """A shipped pin as manifests/components.yaml holds it (#36 item 14: tests read pins, so a
    bump of verl or Megatron-LM breaks no test but the golden files; docs/extending.md)."""
    doc = yaml.safe_load((MANIFESTS / "components.yaml").read_text())
    return str(doc["components"][component][field])


def copy_manifests(tmp: Path) -> Path:
    """A fresh copy of manifests/ (without lock.yaml) at tmp/manifests, replacing any earlier one."""
    dest = tmp / "manifests"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(MANIFESTS, dest, ignore=shutil.ignore_patterns("lock.yaml"))
    return dest


def edit_yaml(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
