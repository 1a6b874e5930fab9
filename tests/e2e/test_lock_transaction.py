"""#36 items 1 and 2: a lock is written only complete and with every check passed, and
`lock --upgrade` is one transaction (components.yaml and lock.yaml move together, or not at
all). Real git repositories on loopback (mtpimage/demo/gitrepos.py), a loopback index."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mtpimage.demo.gitrepos import _megatron_common
from tests.fixtures.gitrepos import advance_branch
from tests.fixtures.lock_fixtures import fast_net, serve_index, standin_manifests  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "mtp-cp-recompute"


def build(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        timeout=300,
    )


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _edit(m: Path, fn) -> None:
    path = m / "components.yaml"
    cat = yaml.safe_load(path.read_text())
    fn(cat)
    path.write_text(yaml.safe_dump(cat, sort_keys=False))


def _refused(proc, before: dict, m: Path, *needles: str) -> None:
    """Exit 1, the real error on stderr's first line, nothing on stdout before it (no
    `changed: X (removed)` lines), and every file of manifests/ byte-identical."""
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    for needle in needles:
        assert needle in first, (needle, first)
    assert "changed:" not in proc.stdout and "upgraded" not in proc.stdout, proc.stdout
    assert "nothing written" in proc.stderr
    assert snapshot(m) == before
    assert not list(m.glob(".*tmp")), "a staged file was left next to lock.yaml"


def test_a_failed_lock_leaves_every_file_byte_identical(
    git_env, fast_net, tmp_path, http_server, fixture_repos, monkeypatch
):
    url = serve_index(http_server, monkeypatch)
    m = standin_manifests(tmp_path / "m", fixture_repos, url)
    ok = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # 1. a set that does not resolve (the index has no torch 2.10.0): no `packages: {}` lock,
    # and not one line per "removed" package before the error
    _edit(m, lambda c: c["packages"]["torch"].update(version="2.10.0"))
    before = snapshot(m)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE)
    _refused(proc, before, m, "does not resolve", "torch")

    # 2. a patch that no longer applies (a site's own patch file, hashed, for a file that is not there)
    _edit(m, lambda c: c["packages"]["torch"].update(version="2.11.0"))
    patch = b"--- a/megatron/core/gone.py\n+++ b/megatron/core/gone.py\n@@ -1 +1 @@\n-old\n+new\n"
    (m / "patches").mkdir(exist_ok=True)
    (m / "patches" / "gone.patch").write_bytes(patch)
    _edit(
        m,
        lambda c: c["components"]["megatron-lm"].update(
            patches=[
                {
                    "file": "patches/gone.patch",
                    "sha256": hashlib.sha256(patch).hexdigest(),
                    "strip": 1,
                    "url": "https://example.org/gone",
                }
            ]
        ),
    )
    before = snapshot(m)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE)
    _refused(proc, before, m, "megatron-lm: patch", "does not apply")

    # 3. a probe that fails (the Megatron-LM commit whose MTP recompute drops padding_mask)
    def broken(c):
        c["components"]["megatron-lm"].pop("patches")
        c["components"]["megatron-lm"]["commit"] = fixture_repos.megatron.commits["broken"]

    _edit(m, broken)
    before = snapshot(m)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE)
    _refused(proc, before, m, "recompute-padding-mask")


def _upgrade_world(private_git_world, tmp_path, http_server, monkeypatch) -> tuple[Path, str]:
    """Manifests whose megatron-lm records the version its commit builds (0.19.0), and a main
    that moved on to a commit building 0.20.0."""
    repos = private_git_world.repos
    m = standin_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    _edit(m, lambda c: c["components"]["megatron-lm"].update(version="0.19.0"))
    ok = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    head = advance_branch(repos.megatron, "main", "Bump to 0.20.0", files=_megatron_common((0, 20, 0, "")))
    return m, head


def test_upgrade_writes_the_version_read_from_the_new_source(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch
):
    m, head = _upgrade_world(private_git_world, tmp_path, http_server, monkeypatch)
    up = build("lock", "--manifests", str(m), "--profile", PROFILE, "--upgrade", "megatron-lm")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "version 0.19.0 -> 0.20.0, read from the source" in up.stdout
    entry = yaml.safe_load((m / "components.yaml").read_text())["components"]["megatron-lm"]
    assert (entry["commit"], entry["version"]) == (head, "0.20.0")
    lock = yaml.safe_load((m / "lock.yaml").read_text())
    assert lock["components"]["megatron-lm"]["commit"] == head
    frozen = build("--manifests", str(m), "--profile", PROFILE, "--frozen", "--dry-run")
    assert frozen.returncode == 0, frozen.stdout + frozen.stderr


def test_upgrade_that_fails_a_check_moves_neither_file(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch
):
    """The new head breaks the recompute probe: components.yaml keeps its commit too."""
    from mtpimage.demo.gitrepos import MTP_PATH, _mtp_explicit

    m, _head = _upgrade_world(private_git_world, tmp_path, http_server, monkeypatch)
    advance_branch(
        private_git_world.repos.megatron, "main", "Regress", files={MTP_PATH: _mtp_explicit(False)}
    )
    before = snapshot(m)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE, "--upgrade", "megatron-lm")
    _refused(proc, before, m, "recompute-padding-mask")
    assert "not moved: megatron-lm: main" in proc.stderr


def test_sigterm_during_upgrade_moves_neither_file(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch
):
    """SIGTERM lands while the upgrade fetches the new commit (a `git` first on PATH sleeps
    on fetch): components.yaml and lock.yaml are both as they were."""
    m, _head = _upgrade_world(private_git_world, tmp_path, http_server, monkeypatch)
    real_git = shutil.which("git")
    shim = tmp_path / "bin"
    shim.mkdir()
    marker = tmp_path / "fetching"
    (shim / "git").write_text(
        f'#!/bin/sh\ncase " $* " in *" fetch "*) touch "{marker}"; sleep 30;; esac\nexec "{real_git}" "$@"\n'
    )
    (shim / "git").chmod(0o755)
    before = snapshot(m)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "build.py"),
            "lock",
            "--manifests",
            str(m),
            "--profile",
            PROFILE,
            "--upgrade",
            "megatron-lm",
        ],
        cwd=ROOT,
        env={**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for _ in range(600):
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=60)[0][-3000:]
    proc.send_signal(signal.SIGTERM)  # to the tool alone, as a cancelled CI job sends it
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out[-3000:]
    assert "Traceback" not in out
    assert snapshot(m) == before


def test_a_bump_the_patch_no_longer_fits_is_refused_naming_the_file_and_what_it_fits(
    private_git_world, fast_net, tmp_path, http_server, monkeypatch
):
    """#36 item 5: the patch applied to the locked commit; the new head changed the file it
    edits: the lock names the patch, the new artifact, and the commit it fitted (lock.yaml)."""
    repos = private_git_world.repos
    m = standin_manifests(tmp_path / "m", repos, serve_index(http_server, monkeypatch))
    readme = "Stand-in for NVIDIA/Megatron-LM (megatron-core) used by tests.\n"
    patch = (f"--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n {readme}+A site's own line.\n").encode()
    (m / "patches").mkdir()
    (m / "patches" / "readme.patch").write_bytes(patch)
    entry = {"file": "patches/readme.patch", "sha256": hashlib.sha256(patch).hexdigest(), "strip": 1}
    _edit(
        m,
        lambda c: c["components"]["megatron-lm"].update(patches=[{**entry, "url": "https://example.org/p"}]),
    )
    ok = build("lock", "--manifests", str(m), "--profile", PROFILE)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    old = repos.megatron.commits["fixed"]
    head = advance_branch(repos.megatron, "main", "Reword the README", files={"README.md": "Reworded.\n"})
    before = snapshot(m)
    proc = build("lock", "--manifests", str(m), "--profile", PROFILE, "--upgrade", "megatron-lm")
    _refused(
        proc,
        before,
        m,
        "megatron-lm: patch patches/readme.patch",
        f"does not apply to https://github.com/NVIDIA/Megatron-LM @ {head[:12]}",
        f"it fits https://github.com/NVIDIA/Megatron-LM @ {old[:12]} (lock.yaml)",
    )
