"""The test suite cleans up what it makes. A real pytest session (a few e2e tests that push,
build with the tool, export, and probe BuildKit) runs in a subprocess; afterwards nothing it
made is left: no local tag under its registry, no image built FROM its base, no BuildKit
probe image, its registry stopped, and its base temp dir gone. Only caches stay.

The session writes its registry's address to MTP_TEST_SESSION_FILE (tests/conftest.py), so
only what this session made is looked at (another session on the same dockerd is not).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtpimage.demo.registry import registry_answers
from tests.fixtures.dockerhost import BASE_NAME_LABEL, PROBE_IMAGE

REPO = Path(__file__).resolve().parents[2]
SELECTION = [
    "tests/e2e/test_infra.py::test_registry_answers_v2",
    "tests/e2e/test_infra.py::test_buildkit_build_install_run_and_push",
    "tests/e2e/test_cluster_e2e.py::test_export_enroot_squashfs_contains_the_version_vector",
]
pytestmark = pytest.mark.timeout(900)


def _refs(host) -> set[str]:
    return set(host.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())


def _built_from(host, prefix: str) -> list[str]:
    ids = host.docker(
        "image", "ls", "-a", "-q", "--no-trunc", "--filter", f"label={BASE_NAME_LABEL}"
    ).stdout.split()
    out = []
    for image_id in set(ids):
        base = host.docker(
            "image",
            "inspect",
            "--format",
            f'{{{{index .Config.Labels "{BASE_NAME_LABEL}"}}}}',
            image_id,
            check=False,
        ).stdout.strip()
        if base.startswith(prefix):
            out.append(image_id)
    return out


def test_a_session_leaves_only_caches(docker_host, tmp_path):
    probe_before = PROBE_IMAGE in _refs(docker_host)
    info = tmp_path / "session.txt"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {
        **os.environ,
        "MTP_TEST_SESSION_FILE": str(info),
        "TMPDIR": str(tmpdir),
    }
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECTION],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-2000:]
    assert info.is_file(), "the session did not report its registry (it used a shared one)"
    registry = info.read_text().split("registry=", 1)[1].strip()
    prefix = f"{registry}/"

    left = sorted(r for r in _refs(docker_host) if r.startswith(prefix))
    assert left == [], f"local tags under the session's registry were left: {left}"
    assert _built_from(docker_host, prefix) == [], "images built FROM the session's base were left"
    if not probe_before:
        assert PROBE_IMAGE not in _refs(docker_host), "the BuildKit probe image was left"
    assert not registry_answers(registry, timeout=2)[0], "the session's registry still runs"
    sessions = [p for p in tmpdir.glob("pytest-of-*/pytest-[0-9]*") if p.is_dir()]
    leftovers = [p for p in tmpdir.rglob("*") if p.is_file() or p.is_symlink()]
    assert sessions == [] and leftovers == [], f"temp files were left: {sessions or leftovers[:10]}"
