"""A real layer of a shipped profile installs from lock.yaml exactly as the image does, in CI:
the rendered requirement file of the `extensions` layer (16 real PyPI wheels, each by sha256)
with the Dockerfile's own flags into a fresh CPython 3.12 venv. Nothing is resolved: every
distribution lands at its locked version, and every requirement `pip check` finds unmet is a
package the lock puts in a LOWER layer (torch's) or one a declared override/no-deps explains.

The git-source layers (Megatron-LM, the bridges, verl) need the pinned upstream commits, which
CI cannot reach (no GitHub, no mirror): they were built for real by scripts/real-stack/build.sh
(docs/real-stack.md)."""

from __future__ import annotations

import glob
import json
import re
import shutil
import subprocess

import pytest
from packaging.utils import canonicalize_name

from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.manifests import manifest

LAYER = "extensions"


def _python312() -> str:
    # pyenv's shim on PATH refuses a version that is not selected: take the interpreter itself
    found = next(iter(sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"))), None) or shutil.which(
        "python3.12"
    )
    if not found:
        pytest.skip("no CPython 3.12 on this machine (the image's Python): the layer's wheels are cp312")
    return found


def test_a_real_layer_installs_exactly_the_lock(tmp_path):
    m = manifest.load()
    plan = plan_for(m, "mtp-detach", None)
    files = render(plan, m.root).files
    dockerfile = files["Dockerfile"].decode()
    req_name = f"{LAYER}-pypi.txt"
    req = tmp_path / req_name
    req.write_bytes(files[f"build/requirements/{req_name}"])
    # the exact command the layer's RUN line uses
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    cmd = next(c.strip() for c in joined.split(";") if f"-r /tmp/mtp-build/requirements/{req_name}" in c)
    assert cmd.startswith("pip install --no-deps --require-hashes --only-binary=:all: --index-url"), cmd
    venv = tmp_path / "venv"
    subprocess.run([_python312(), "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    proc = subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--index-url",
            "https://pypi.org/simple",
            "-r",
            str(req),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    locked = {r.name: r.version for r in plan.locked if r.layer == LAYER and r.sha256}
    assert len(locked) >= 10
    listed = json.loads(
        subprocess.run(
            [py, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
        ).stdout
    )
    installed = {canonicalize_name(d["name"]): d["version"] for d in listed}
    for name, version in locked.items():
        assert installed.get(name) == version, (name, installed.get(name), version)
    below = {r.name for r in plan.locked if r.layer in ("torch",)} | {p.name for p in plan.packages}
    check = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True).stdout.splitlines()
    for row in check:
        m_ = re.match(r"^(\S+) \S+ requires (\S+?),", row)
        assert m_, row
        assert canonicalize_name(m_.group(2)) in below, f"{row}: not provided by a lower layer"
