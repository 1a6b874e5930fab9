"""The remembered no-op against the real engine: a hit prints what the full path prints, a
changed input or a moved tag misses, and the full path then puts things right."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    return image_world(docker_host, git_world, tmp_path_factory, "fastpath")


def _run(world, *env_pairs):
    env = dict(world["env"])
    env.update(dict(env_pairs))
    env["MTP_FASTPATH_TRACE"] = "1"
    proc = world_cli({**world, "env": env}, "--profile", PROFILE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _id(world, ref):
    proc = world["host"].docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_hit_replays_the_full_path_and_every_change_misses(world):
    first = _run(world)  # builds or finds the image; remembers the run
    assert "fastpath: remembered" in first.stderr, first.stderr[-2000:]
    hit = _run(world)
    assert "fastpath: hit" in hit.stderr
    full = _run(world, ("MTP_FASTPATH", "0"))
    assert "fastpath" not in full.stderr
    assert "up to date" in full.stdout and hit.stdout == full.stdout

    # a changed byte of a manifest misses; the full path decides (same image: comments do not
    # change the identity) and the run is remembered again under the new bytes
    profile = Path(world["manifests"]) / "profiles" / f"{PROFILE}.yaml"
    profile.write_text(profile.read_text() + "# touched by the fast-path test\n")
    changed = _run(world)
    assert "fastpath: miss (no memo" in changed.stderr and "up to date" in changed.stdout
    assert "fastpath: hit" in _run(world).stderr

    # the profile tag moved elsewhere: a miss, and the full path moves it back
    image = _id(world, f"mtp-verl:{PROFILE}")
    world["host"].docker("tag", world["base"], f"mtp-verl:{PROFILE}")
    moved = _run(world)
    assert "fastpath: miss (mtp-verl:" in moved.stderr and "up to date" in moved.stdout
    assert _id(world, f"mtp-verl:{PROFILE}") == image

    # an engine that does not answer is never taken for "up to date"
    down = world_cli(
        {
            **world,
            "env": {**world["env"], "DOCKER_HOST": "unix:///nonexistent.sock", "MTP_FASTPATH_TRACE": "1"},
        },
        "--profile",
        PROFILE,
    )
    assert down.returncode != 0 and "up to date" not in down.stdout


def test_summary_file_hits_and_writes_what_the_full_path_writes(world, tmp_path):
    """scripts/real-stack/build.sh passes --summary-file: its warm no-op is a hit, and the
    summary it leaves is byte for byte the full path's."""
    env = {**world["env"], "MTP_FASTPATH_TRACE": "1"}
    summary = tmp_path / "hit.json"
    first = world_cli({**world, "env": env}, "--profile", PROFILE, "--summary-file", str(summary))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    hit = world_cli({**world, "env": env}, "--profile", PROFILE, "--summary-file", str(summary))
    assert "fastpath: hit" in hit.stderr, hit.stderr[-2000:]
    full_summary = tmp_path / "full.json"
    full = world_cli(
        {**world, "env": {**env, "MTP_FASTPATH": "0"}},
        "--profile",
        PROFILE,
        "--summary-file",
        str(full_summary),
    )
    assert full.returncode == 0 and "up to date" in full.stdout
    assert hit.stdout == full.stdout
    assert summary.read_bytes() == full_summary.read_bytes()
