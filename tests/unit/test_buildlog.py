"""A wheel that changed under the same URL, as pip refuses it inside a build (issue #22): real
pip installs a locked requirement (`--require-hashes`, the Dockerfile's flags) from a loopback
index whose file's bytes changed after the lock; its several-line refusal, as BuildKit's plain
progress shows it, becomes one line naming the package, the URL, both sha256 and the fix."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from mtpimage.build import buildlog
from tests.fixtures.wheels import make_wheel


def _pip_refusal(tmp_path, http_server) -> tuple[str, str, str, str]:
    project = http_server.root / "simple" / "tiny-ext"
    locked = make_wheel(tmp_path / "then", payload="VALUE = 1\n")
    pinned = hashlib.sha256(locked.read_bytes()).hexdigest()
    served = make_wheel(project, payload="VALUE = 2  # rebuilt, same name\n")
    got = hashlib.sha256(served.read_bytes()).hexdigest()
    req = tmp_path / "layer.txt"
    req.write_text(f"tiny-ext==0.1 --hash=sha256:{pinned}\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            str(tmp_path / "target"),
            "--index-url",
            http_server.url_for("simple"),
            "-r",
            str(req),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"},
    )
    assert proc.returncode != 0 and buildlog.HEAD in proc.stderr, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr, pinned, got, http_server.url_for(f"simple/tiny-ext/{served.name}")


def test_pips_hash_refusal_in_a_build_log_is_one_line(tmp_path, http_server):
    text, pinned, got, url = _pip_refusal(tmp_path, http_server)
    # as BuildKit's plain progress prints a RUN's output, with the stage's summary after it
    log = [f"#12 {1.5 + i / 10:.3f} {line}" for i, line in enumerate(text.splitlines())]
    log += [
        '#12 ERROR: process "/bin/bash -o pipefail -euc pip install ..." did not complete successfully: exit code: 1'
    ]
    line = buildlog.explain(log)
    assert line == (
        f"pip refused a file whose sha256 is not the locked one: tiny-ext==0.1 from {url} has sha256 "
        f"{got}, lock.yaml pins {pinned} (fix: the file changed under the same URL (a re-upload, or a "
        "mirror serving other bytes); find out why before `python build.py lock` records the new hash)"
    )
    assert buildlog.explain(text) == line  # the same without BuildKit's prefixes


def test_a_log_without_pips_refusal_explains_nothing():
    assert buildlog.explain("#5 0.1 ERROR: No matching distribution found for tiny-ext==0.1\n") is None
    assert buildlog.explain([]) is None


def test_a_failed_build_says_the_mismatch_in_one_line(tmp_path, http_server, monkeypatch):
    """The engine's build: a 'docker build' that prints pip's refusal (here a script that
    replays it, as BuildKit's plain progress would) fails with buildlog's one line."""
    from mtpimage.engine import dockerengine
    from mtpimage.engine.containerengine import BuildFailed, BuildRequest

    text, pinned, got, url = _pip_refusal(tmp_path, http_server)
    replay = tmp_path / "log.txt"
    # far more lines after the refusal than the 25 the engine keeps as its tail
    replay.write_text(
        "".join(f"#9 2.{i:03d} {line}\n" for i, line in enumerate(text.splitlines()))
        + "".join(f"#9 ERROR: summary line {i}\n" for i in range(40))
    )
    script = f"import sys; sys.stdout.write(open({str(replay)!r}).read()); sys.exit(1)"
    kit = dockerengine.BuildKitCLI("docker", "buildx", "test")
    monkeypatch.setattr(dockerengine, "detect", lambda: kit)
    monkeypatch.setattr(dockerengine, "build_argv", lambda kit, req, iidfile: [sys.executable, "-c", script])
    with pytest.raises(BuildFailed) as exc:
        dockerengine.DockerEngine().build(BuildRequest(context_tar=b"", labels={}), echo=False)
    assert str(exc.value) == buildlog.explain(text)
    assert f"tiny-ext==0.1 from {url} has sha256 {got}, lock.yaml pins {pinned}" in str(exc.value)
