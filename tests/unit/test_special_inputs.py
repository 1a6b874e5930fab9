"""Input paths that are not regular files, or too big, are refused in one line (exit 2)
before a byte is read (issue #46, manifests/inputfile.py): a character device as
components.yaml (the process grew to 23.7 GB), a FIFO as a profile (`list` hung), a
directory, a model config nested 100,000 deep (exit 70), a CA bundle that is a device.

Each runs build.py in a child under a memory limit (resource.setrlimit): a reader without
bounds dies of MemoryError (exit 70) instead of filling this machine. A hang is caught by the
child's timeout, not by a clock in the test."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtpimage.errors import InputError
from mtpimage.locations import DEFAULT_MANIFESTS
from mtpimage.manifests import inputfile

from .helpers import REPO

MEMORY = 1 << 30  # address space of the child: Python and the tool's imports fit in it
HANG = 60  # seconds: far beyond a refusal; only a reader that blocks gets here


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MTP_FASTPATH": "0", "MTP_DOCKER_CLI": "/nonexistent/docker"}
    env.pop("MTP_DEBUG", None)
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG,
        preexec_fn=_limited,
    )


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def manifests(tmp_path) -> Path:
    root = tmp_path / "manifests"
    shutil.copytree(DEFAULT_MANIFESTS, root)
    return root


def test_components_yaml_that_is_a_character_device(manifests):
    (manifests / "components.yaml").unlink()
    (manifests / "components.yaml").symlink_to("/dev/zero")
    proc = _run("--manifests", str(manifests), "list")
    _one_line(proc, "components.yaml", "a character device", "not a regular file")


def test_a_profile_that_is_a_fifo(manifests):
    os.mkfifo(manifests / "profiles" / "waiting.yaml")  # no writer will ever come
    proc = _run("--manifests", str(manifests), "list")
    _one_line(proc, "profiles/waiting.yaml", "a FIFO")


def test_a_profile_that_is_a_directory(manifests):
    (manifests / "profiles" / "folder.yaml").mkdir()
    proc = _run("--manifests", str(manifests), "check")
    _one_line(proc, "profiles/folder.yaml", "a directory")


def test_a_main_job_with_a_fifo_profile_does_not_hang_in_the_fast_path(manifests):
    """The fast path hashes every file of manifests/ before the CLI runs: it must not read
    a FIFO either (it would block there before any check)."""
    os.mkfifo(manifests / "profiles" / "waiting.yaml")
    env = {**os.environ, "MTP_DOCKER_CLI": "/nonexistent/docker"}
    env.pop("MTP_FASTPATH", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "build.py"), "--manifests", str(manifests), "--profile", "mtp-detach"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG,
        preexec_fn=_limited,
    )
    _one_line(proc, "profiles/waiting.yaml", "a FIFO")


def test_a_model_config_nested_100000_deep_is_an_input_error(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text("[" * 100_000 + "]" * 100_000)
    proc = _run("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    _one_line(proc, str(cfg), "nested too deep")


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_model_config_that_is_not_a_regular_file(tmp_path, kind):
    cfg = tmp_path / "config.json"
    if kind == "device":
        cfg.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(cfg)
    else:
        cfg.mkdir()
    proc = _run("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    _one_line(proc, str(cfg), "not a regular file")


def test_a_model_config_over_its_limit_is_refused_unread(tmp_path):
    from mtpimage.plan.modelconfig import MAX_BYTES

    cfg = tmp_path / "config.json"
    with open(cfg, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: nothing to read but its size
    proc = _run("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    _one_line(proc, str(cfg), f"{MAX_BYTES + 1} bytes")


@pytest.mark.parametrize("flag", ["--ca-bundle", "--netrc"])
def test_a_ca_bundle_or_netrc_that_is_a_device_or_missing_is_refused_before_the_build(manifests, flag):
    """Checked when the command line is read: also when the image would be up to date and
    no build would read it (issue #46); docker is never asked (its CLI does not exist here)."""
    for path in ("/dev/zero", str(manifests / "missing.pem")):
        proc = _run("--manifests", str(manifests), "--profile", "mtp-detach", flag, path)
        line = _one_line(proc, flag, path)
        assert "docker" not in line


def test_inputfile_reads_a_regular_file_within_its_limit(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\n")
    assert inputfile.read_bytes(path, 5, "a manifest") == b"a: 1\n"
    with pytest.raises(InputError, match="6 bytes; a manifest may have at most 5"):
        path.write_bytes(b"a: 12\n")
        inputfile.read_bytes(path, 5, "a manifest")
    with pytest.raises(InputError, match="file not found"):
        inputfile.read_bytes(tmp_path / "nope", 5, "a manifest")


def test_explain_says_what_it_found_in_a_model_config(tmp_path):
    from .helpers import run_main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_next", "mtp_num_hidden_layers": 1}))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert f"# model {cfg}: MTP layers: 1 (mtp_num_hidden_layers)" in proc.stdout
    # verl's order: the first value > 0 wins; num_nextn_predict_layers 0 does not hide the next
    cfg.write_text(json.dumps({"num_nextn_predict_layers": 0, "text_config": {"mtp_num_hidden_layers": 2}}))
    proc = run_main(
        "explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg), "--json"
    )
    assert json.loads(proc.stdout)["model"] == {"mtp_layers": 2, "key": "text_config.mtp_num_hidden_layers"}


def test_a_layer_count_verl_cannot_compare_is_named(tmp_path):
    from .helpers import run_main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_nextn_predict_layers": None, "mtp_num_hidden_layers": 1}))
    proc = run_main("explain", "--profile", "mtp-detach", "--target", "rl", "--model-config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "num_nextn_predict_layers is null, not a number" in proc.stdout and "TypeError" in proc.stdout
    assert "# model " not in proc.stdout
