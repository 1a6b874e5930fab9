"""A wheel that changed under the same URL, as pip refuses it inside a build (issue #22): real
pip installs a locked requirement (`--require-hashes`, the Dockerfile's flags) from a loopback
index whose file's bytes changed after the lock; its several-line refusal, as BuildKit's plain
progress shows it, becomes one line naming the package, the URL, both sha256 and the fix."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest

from mtpimage.engine import buildlog
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
        "mirror serving other bytes); find out why before `python3 build.py lock` records the new hash)"
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
    monkeypatch.setattr(
        dockerengine, "build_argv", lambda kit, req, iidfile, secrets=None: [sys.executable, "-c", script]
    )
    with pytest.raises(BuildFailed) as exc:
        dockerengine.DockerEngine().build(BuildRequest(context_tar=b"", labels={}), echo=False)
    assert str(exc.value) == buildlog.explain(text)
    assert f"tiny-ext==0.1 from {url} has sha256 {got}, lock.yaml pins {pinned}" in str(exc.value)


def _failed_compile(tmp_path) -> str:
    """What a real failing C++ compile says: tests/fixtures/tiny_ext.py with one bad line,
    built by pip and setuptools with this machine's compiler."""
    import shutil
    import zipfile

    from tests.fixtures import tiny_ext

    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler here")
    sdist = tmp_path / "broken.zip"
    sdist.write_bytes(tiny_ext.sdist_bytes(variant='broken\nstatic_assert(false, "the cause");'))
    with zipfile.ZipFile(sdist) as z:
        z.extractall(tmp_path / "src")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "out"),
            ".",
        ],
        cwd=tmp_path / "src" / f"{tiny_ext.MODULE}-{tiny_ext.VERSION}",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, proc.stdout
    return proc.stdout + proc.stderr


def test_a_failed_compile_says_its_cause_then_where_the_log_is(tmp_path):
    text = _failed_compile(tmp_path)
    run = "/bin/bash -o pipefail -euc " + "python /tmp/mtp-build/lib/mtp_extension.py --arg " * 40
    log = [f"#21 {3 + i / 10:.3f} {line}" for i, line in enumerate(text.splitlines())]
    log += [
        f'#21 ERROR: process "{run}" did not complete successfully: exit code: 1',
        "------",
        f" > [mtp-ext-wheel-x 5/5] RUN {run}",
    ]
    log += [f'ERROR: failed to solve: process "{run}" did not complete successfully: exit code: 1']
    w = buildlog.Watcher()
    for line in log:
        w.feed(line)
    line = buildlog.failure(w, log[-25:], tmp_path / "x.log", "mtp-ext-wheel-x")
    assert line.startswith("build of stage mtp-ext-wheel-x failed: add.cpp:")
    assert "error: static assertion failed" in line or "error: static_assert" in line, line
    # setuptools' verdict, its argv shortened to the program
    assert re.search(
        r"; error: command '[^' ]*(g\+\+|gcc)' (failed with|returned non-zero) exit (code|status) 1\.? \(full log",
        line,
    ), line
    assert line.endswith(f" (full log: {tmp_path / 'x.log'})") and "mtp_extension.py --arg" not in line
    assert len(line) < 700, len(line)


def test_a_failed_build_keeps_its_log_and_names_it(tmp_path, monkeypatch):
    """DockerEngine.build with a stand-in docker CLI that fails as BuildKit does: the error is
    the cause and the log's path; the log is kept (a build that succeeds leaves none)."""
    from mtpimage.engine import dockerengine
    from mtpimage.engine.containerengine import BuildFailed, BuildRequest

    cli = tmp_path / "docker"
    cli.write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in "buildx version") exit 0;; "version --format") echo 99; exit 0;; esac\n'
        "cat >/dev/null\n"
        'if [ -n "$MTP_FAKE_OK" ]; then echo "#1 DONE"; exit 0; fi\n'
        "echo '#5 1.0 add.cpp:2:1: error: expected unqualified-id'\n"
        "echo \"#5 1.1 error: command '/usr/bin/gcc' failed with exit code 1\"\n"
        "echo '#5 ERROR: process \"/bin/sh -c python x.py\" did not complete successfully: exit code: 1'\n"
        "exit 1\n"
    )
    cli.chmod(0o755)
    monkeypatch.setenv("MTP_DOCKER_CLI", str(cli))
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    dockerengine.detect.cache_clear()
    try:
        req = BuildRequest(context_tar=b"", labels={}, target="mtp-ext-wheel-x", output_dir=tmp_path / "out")
        with pytest.raises(BuildFailed) as info:
            dockerengine.DockerEngine().build(req, echo=False)
        line = info.value.one_line()
        assert line.startswith(
            "build of stage mtp-ext-wheel-x failed: add.cpp:2:1: error: expected unqualified-id; "
            "error: command '/usr/bin/gcc' failed with exit code 1 (full log: "
        ), line
        [kept] = (tmp_path / "cache" / "logs").glob("*.log")
        assert str(kept) in line and "did not complete successfully" in kept.read_text()
        monkeypatch.setenv("MTP_FAKE_OK", "1")
        dockerengine.DockerEngine().build(req, echo=False)
        assert list((tmp_path / "cache" / "logs").glob("*.log")) == [kept]  # a success leaves none
    finally:
        dockerengine.detect.cache_clear()
