"""`lock` refuses a package that would install without a sha256 (issue #22): one whose index
does not answer has no file to hash, so the image could only install it by version alone.
Before, lock recorded it as an unverified stub and `check` caught it later; now lock fails
at once, one line, and writes nothing. A package the tool compiles from a source pinned by
hash is not refused: its bytes are pinned by that hash, not by an index file.

Real `build.py lock` against the loopback git stand-ins (tests/manifests/) and a loopback
PEP 503 index (a closed port stands for the unreachable one). No docker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from mtpimage.lock.pydeps import write_stub_wheel

REPO = Path(__file__).resolve().parents[2]
CLOSED = "https://closed.example/simple"  # rewritten to a closed loopback port
PROFILE = "test-detach"
SDIST_SHA = "ab" * 32


def _manifests(tmp: Path, far: dict) -> Path:
    m = tmp / "manifests"
    shutil.copytree(REPO / "tests" / "manifests", m)
    cat = yaml.safe_load((m / "components.yaml").read_text())
    cat["indexes"]["closed"] = CLOSED
    cat["packages"] = {
        "tiny-dep": {"version": "1.0", "layer": "verl"},
        "far-pkg": {"version": "2.0", "layer": "verl", "index": "closed", **far},
    }
    (m / "components.yaml").write_text(yaml.safe_dump(cat, sort_keys=False))
    base = m / "profiles" / "base.yaml"
    prof = yaml.safe_load(base.read_text())
    prof["stack"]["packages"] = ["tiny-dep", "far-pkg"]
    base.write_text(yaml.safe_dump(prof, sort_keys=False))
    return m


def _lock(m: Path, git_world, http_server, tmp: Path) -> subprocess.CompletedProcess:
    d = http_server.root / "simple" / "tiny-dep"
    d.mkdir(parents=True, exist_ok=True)
    write_stub_wheel(d, "tiny-dep", "1.0")
    env = {
        **os.environ,
        **git_world.env,
        "MTP_CACHE_DIR": str(tmp / "cache"),
        "MTP_INDEX_REWRITE": f"https://pypi.org/simple={http_server.url_for('simple')};"
        f"{CLOSED}=http://127.0.0.1:9/simple",
        "MTP_NET_RETRIES": "1",
        "MTP_NET_BACKOFF_MAX": "0.1",
        "MTP_HTTP_TIMEOUT": "5",
    }
    env.pop("MTP_DEBUG", None)
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), "lock", "--manifests", str(m), "--profile", PROFILE],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_lock_refuses_a_package_from_an_index_that_does_not_answer(git_world, http_server, tmp_path):
    m = _manifests(tmp_path, {"requires_dist": {"requires": ["tiny-dep"], "source": "a test fixture"}})
    proc = _lock(m, git_world, http_server, tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert line.startswith(  # the lock that --manifests names, not the checkout's
        f"error: lock failed, {m / 'lock.yaml'} left unchanged: far-pkg==2.0 from index closed"
    )
    assert CLOSED in line and "without a sha256" in line and "(fix: " in line
    assert "tiny-dep" not in line  # its index answered: it is locked by sha256
    assert not (m / "lock.yaml").exists()


def test_lock_accepts_a_built_package_pinned_by_sdist_sha256(git_world, http_server, tmp_path):
    build = {
        "requires_dist": {"requires": ["tiny-dep"], "source": "a test fixture"},
        "build": {
            "sdist": {"url": "https://closed.example/far_pkg-2.0.tar.gz", "sha256": SDIST_SHA},
            "env": {},
        },
    }
    m = _manifests(tmp_path, build)
    proc = _lock(m, git_world, http_server, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load((m / "lock.yaml").read_text())
    pyset = doc["python_sets"][doc["profiles"][PROFILE]["python_set"]]
    assert pyset["packages"]["far-pkg"]["source"] == "built"
    assert pyset["packages"]["far-pkg"]["built_from"]["sha256"] == SDIST_SHA
    assert len(pyset["packages"]["tiny-dep"]["sha256"]) == 64
    # its source could not be checked from here: recorded, not refused
    assert "far-pkg: source" in proc.stdout
