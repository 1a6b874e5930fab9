"""What a user of a built test image sees: `pip freeze` names each git component's repository
and commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from tests.fixtures.image_fixtures import image_world, world_cli

pytestmark = pytest.mark.timeout(900)
PROFILE = "test-detach"
IMAGE = f"mtp-verl:{PROFILE}"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "environment")
    proc = world_cli(w, "--profile", PROFILE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return w


def _in_image(world, *argv: str, image: str = IMAGE):
    return world["host"].docker("run", "--rm", image, *argv, check=False, timeout=300)


def test_pip_freeze_and_inspect_name_each_git_component_by_repository_and_commit(world):
    vector = json.loads(_in_image(world, "cat", "/opt/mtp/version.json").stdout)
    git = {canonicalize_name(c["package"]): c for c in vector["components"] if c["source"] == "git"}
    catalogue = yaml.safe_load((Path(world["manifests"]) / "components.yaml").read_text())["components"]
    assert git and any("subdir" in catalogue[c["name"]] for c in git.values())
    freeze = _in_image(world, "pip", "freeze").stdout
    assert "file:///tmp" not in freeze, freeze
    lines = {canonicalize_name(line.split(" @ ")[0]): line for line in freeze.splitlines() if " @ " in line}
    for name, comp in git.items():
        subdir = catalogue[comp["name"]].get("subdir", ".")
        sub = "" if subdir == "." else f"#subdirectory={subdir}"
        assert lines.get(name, "").endswith(f" @ git+{comp['repo']}@{comp['commit']}{sub}"), (name, freeze)
    inspect = json.loads(_in_image(world, "pip", "inspect").stdout)
    origins = {canonicalize_name(d["metadata"]["name"]): d.get("direct_url") for d in inspect["installed"]}
    for name, comp in git.items():
        assert origins[name]["url"] == comp["repo"]
        assert origins[name]["vcs_info"]["commit_id"] == comp["commit"]
        assert origins[name]["vcs_info"]["vcs"] == "git"
