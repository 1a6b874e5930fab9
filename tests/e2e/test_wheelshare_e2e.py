"""End to end: the wheel cache shared through a real registry (distribution, the session's own
on loopback). A pushed wheel comes back byte for byte into another machine's cache and pip
installs it; standard HTTP reads the artifact (plain requests, as curl would); an artifact
whose wheel blob was swapped under the same tag is refused and nothing enters the cache."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid

import pytest
import requests

from mtpimage.ext import wheelshare
from mtpimage.ext.wheelcache import WheelCache, cache_key
from mtpimage.ext.wheelshare import ArtifactRefused
from mtpimage.imageref import Registry
from mtpimage.publish.registryclient import RegistryClient
from tests.fixtures.wheels import make_wheel
from tests.unit.helpers import run_cli

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def repository(registry) -> str:
    # One repository per test: tags of one test never answer another's pull.
    return f"{registry}/t{uuid.uuid4().hex[:8]}/{wheelshare.REPOSITORY}"


def _inputs(tag: str) -> dict:
    return {
        "schema": 1,
        "name": "tiny-ext",
        "version": "0.1",
        "torch": "2.11.0",
        "archs": ["90"],
        "test": tag,
    }


def _cached(tmp_path, name: str, payload: str = "VALUE = 1\n"):
    inputs = _inputs(uuid.uuid4().hex)
    key = cache_key(inputs)
    cache = WheelCache(tmp_path / name)
    entry = cache.put(
        key, make_wheel(tmp_path / f"{name}-src", payload=payload), {"inputs": inputs, "built_by": name}
    )
    return cache, key, entry


def test_push_then_pull_gives_the_same_bytes(tmp_path, repository):
    here, key, entry = _cached(tmp_path, "here")
    ref = wheelshare.push(here, key, repository)
    name, _, digest = ref.partition("@")
    assert name == f"{repository}:{key}" and digest.startswith("sha256:")
    assert wheelshare.push(here, key, repository) == ref  # already there: nothing new

    # What the registry holds, read with plain HTTP (as curl or any OCI client would).
    host, path = repository.split("/", 1)
    resp = requests.get(
        f"http://{host}/v2/{path}/manifests/{key}",
        headers={"Accept": wheelshare.OCI_MANIFEST},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == wheelshare.OCI_MANIFEST
    assert (
        resp.headers["Docker-Content-Digest"]
        == digest
        == "sha256:" + hashlib.sha256(resp.content).hexdigest()
    )
    manifest = resp.json()
    assert manifest["artifactType"] == wheelshare.ARTIFACT_TYPE
    assert manifest["config"]["mediaType"] == wheelshare.CONFIG_TYPE
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == wheelshare.LAYER_TYPE
    assert layer["annotations"][wheelshare.TITLE] == entry.filename
    blob = requests.get(f"http://{host}/v2/{path}/blobs/{layer['digest']}", timeout=30)
    assert blob.content == entry.path.read_bytes()
    config = requests.get(f"http://{host}/v2/{path}/blobs/{manifest['config']['digest']}", timeout=30).json()
    assert config["sha256"] == entry.sha256 and config["key"] == key and config["built_by"] == "here"

    there = WheelCache(tmp_path / "there")
    pulled = wheelshare.pull(there, key, repository)
    assert pulled is not None and there.get(key) == pulled
    assert pulled.path.read_bytes() == entry.path.read_bytes()
    assert pulled.sha256 == entry.sha256 and pulled.filename == entry.filename
    assert pulled.meta["inputs"] == entry.meta["inputs"] and pulled.meta["pulled_from"] == f"{name}@{digest}"

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            pulled.path,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (target / "tiny_ext" / "__init__.py").read_text() == "VALUE = 1\n"


def test_a_key_the_registry_does_not_have_is_none(tmp_path, repository):
    assert wheelshare.pull(WheelCache(tmp_path / "c"), cache_key(_inputs("absent")), repository) is None


def test_a_swapped_wheel_blob_is_refused(tmp_path, repository):
    here, key, entry = _cached(tmp_path, "here")
    wheelshare.push(here, key, repository)
    # Someone replaces the wheel under the same tag: same config (it still records the first
    # wheel's sha256), a layer with other bytes whose own digest is right.
    other = make_wheel(tmp_path / "evil", payload="import os\n")
    other_bytes = other.read_bytes()
    other_sha = hashlib.sha256(other_bytes).hexdigest()
    host, path = repository.split("/", 1)
    client = RegistryClient(Registry(host, ""))
    client.upload_blob(path, f"sha256:{other_sha}", other_bytes)
    config = wheelshare.canonical(entry.meta)
    swapped = wheelshare.artifact_manifest(key, config, other_sha, len(other_bytes), entry.filename)
    client.put_manifest(path, key, swapped, wheelshare.OCI_MANIFEST)

    there = WheelCache(tmp_path / "there")
    with pytest.raises(ArtifactRefused) as exc:
        wheelshare.pull(there, key, repository)
    line = exc.value.one_line()
    assert f"sha256:{other_sha}" in line and entry.sha256 in line and "fix:" in line and key in line
    assert there.get(key) is None
    assert not there.root.exists() or list(there.root.iterdir()) == []  # no entry, no temp left

    # ...and a push from a cache holding the first wheel does not paper over it silently.
    said = []
    assert wheelshare.push(here, key, repository, say=said.append).endswith(
        "@sha256:" + hashlib.sha256(swapped).hexdigest()
    )
    assert said and "already holds another build" in said[0]


def test_cli_push_list_pull(tmp_path, registry):
    namespace = f"{registry}/c{uuid.uuid4().hex[:8]}"
    here, key, entry = _cached(tmp_path / "a", "ext-wheels")  # = $MTP_CACHE_DIR/ext-wheels
    env_a = {"MTP_CACHE_DIR": str(tmp_path / "a")}
    env_b = {"MTP_CACHE_DIR": str(tmp_path / "b")}

    proc = run_cli("wheels", "push", "--registry", namespace, "--json", env=env_a)
    assert proc.returncode == 0, proc.stderr
    (pushed,) = json.loads(proc.stdout)
    assert pushed["key"] == key and pushed["reference"].startswith(f"{namespace}/ext-wheels:{key}@sha256:")

    proc = run_cli("wheels", "pull", "--registry", namespace, key[:12], env=env_b)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"pulled {key[:12]}")
    listed = json.loads(run_cli("wheels", "list", "--json", "--verify", env=env_b).stdout)
    assert [(w["key"], w["sha256"]) for w in listed["wheels"]] == [(key, entry.sha256)]

    missing = cache_key(_inputs("missing"))
    proc = run_cli("wheels", "pull", "--registry", namespace, missing, env=env_b)
    assert proc.returncode == 2 and missing in proc.stderr and "wheels push" in proc.stderr


def _rewrite_artifact(tmp_path, client, path, key, entry) -> str:
    """Replace the registry's wheel for `key` AND its config's records of it (sha256, size),
    as someone with push rights would: every check of the artifact itself passes; -> sha256."""
    other = make_wheel(tmp_path / "evil", payload="import os  # evil\n")
    data = other.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    client.upload_blob(path, f"sha256:{sha}", data)
    config = wheelshare.canonical({**entry.meta, "sha256": sha, "size": len(data)})
    client.upload_blob(path, "sha256:" + hashlib.sha256(config).hexdigest(), config)
    manifest = wheelshare.artifact_manifest(key, config, sha, len(data), entry.filename)
    client.put_manifest(path, key, manifest, wheelshare.OCI_MANIFEST)
    return sha


def test_an_artifact_whose_wheel_and_records_were_rewritten_is_refused_against_the_pin(tmp_path, repository):
    from mtpimage.ext.wheelpins import Pin, PinMismatch

    here, key, entry = _cached(tmp_path, "here")
    wheelshare.push(here, key, repository)
    host, path = repository.split("/", 1)
    evil = _rewrite_artifact(tmp_path, RegistryClient(Registry(host, "")), path, key, entry)
    # unpinned, the rewritten artifact passes every check it carries (the finding)
    assert wheelshare.pull(WheelCache(tmp_path / "unpinned"), key, repository).sha256 == evil

    pin = Pin("tiny-ext", "0.1", entry.filename, entry.sha256, "built")
    there = WheelCache(tmp_path / "there")
    with pytest.raises(PinMismatch) as exc:
        wheelshare.pull(there, key, repository, pin=pin)
    line = exc.value.one_line()
    assert exc.value.exit_code == 3
    assert f"registry artifact {repository}:{key}@sha256:" in line
    assert f"has sha256 {evil}, wheels.lock.yaml pins {entry.sha256}" in line and "(fix: " in line
    assert there.get(key) is None and (not there.root.exists() or list(there.root.iterdir()) == [])


def test_cli_pull_refuses_a_rewritten_artifact_against_the_manifests_pins(tmp_path, registry):
    from mtpimage.ext import wheelpins

    namespace = f"{registry}/p{uuid.uuid4().hex[:8]}"
    here, key, entry = _cached(tmp_path / "a", "ext-wheels")
    wheelshare.push(here, key, wheelshare.repository_for(namespace))
    host, path = wheelshare.repository_for(namespace).split("/", 1)
    evil = _rewrite_artifact(tmp_path, RegistryClient(Registry(host, "")), path, key, entry)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    wheelpins.write(manifests, {key: wheelpins.Pin("tiny-ext", "0.1", entry.filename, entry.sha256, "built")})
    env_b = {"MTP_CACHE_DIR": str(tmp_path / "b")}
    proc = run_cli("wheels", "pull", "--manifests", str(manifests), "--registry", namespace, key, env=env_b)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and evil in errors[0] and entry.sha256 in errors[0], proc.stderr
    assert not (tmp_path / "b" / "ext-wheels" / key).exists()
