"""What a pull accepts from a registry (mtpimage/ext/wheelshare.py), without one: the artifact's
manifest and config are checked field by field before any wheel byte is trusted. The real
registry round trip is tests/e2e/test_wheelshare_e2e.py."""

from __future__ import annotations

import hashlib
import json

import pytest

from mtpimage.errors import InputError
from mtpimage.ext import wheelshare
from mtpimage.ext.wheelcache import WheelCache, cache_key
from mtpimage.ext.wheelshare import (
    ArtifactRefused,
    artifact_manifest,
    canonical,
    check_config,
    check_manifest,
)
from mtpimage.publish.registryclient import RegistryHTTPError, RegistryUnreachable

INPUTS = {"schema": 1, "name": "apex", "version": "0.1", "archs": ["90"]}
KEY = cache_key(INPUTS)
FILENAME = "apex-0.1-cp312-cp312-linux_x86_64.whl"
WHEEL_SHA = "ab" * 32
META = {"inputs": INPUTS, "key": KEY, "filename": FILENAME, "sha256": WHEEL_SHA, "size": 1234}
REF = "127.0.0.1:5000/mtp/ext-wheels:" + KEY


def _manifest(change=None) -> bytes:
    m = json.loads(artifact_manifest(KEY, canonical(META), WHEEL_SHA, 1234, FILENAME))
    if change:
        change(m)
    return json.dumps(m).encode()


def test_the_artifact_is_what_the_brief_names():
    config = canonical(META)
    m = json.loads(artifact_manifest(KEY, config, WHEEL_SHA, 1234, FILENAME))
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["artifactType"] == "application/vnd.mtp-image-builder.wheel.v1"
    assert m["config"] == {
        "mediaType": "application/vnd.mtp-image-builder.wheel.config.v1+json",
        "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
        "size": len(config),
    }
    (layer,) = m["layers"]
    assert layer["mediaType"] == "application/vnd.mtp-image-builder.wheel.v1+zip"
    assert layer["digest"] == f"sha256:{WHEEL_SHA}" and layer["size"] == 1234
    assert layer["annotations"] == {"org.opencontainers.image.title": FILENAME}
    config_desc, layer_desc, name = check_manifest(_manifest(), REF)
    assert name == FILENAME and layer_desc == layer and config_desc == m["config"]
    assert check_config(config, KEY, layer, FILENAME, REF) == META


def test_the_config_blob_is_canonical():
    assert canonical(dict(reversed(list(META.items())))) == canonical(META)


def _set(path, value):
    def change(m):
        target = m
        *parents, last = path
        for p in parents:
            target = target[p]
        target[last] = value

    return change


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            _set(["mediaType"], "application/vnd.docker.distribution.manifest.v2+json"),
            "not an OCI image manifest",
        ),
        (_set(["artifactType"], "application/vnd.other"), "artifactType"),
        (lambda m: m.pop("artifactType"), "artifactType"),
        (
            _set(["config", "mediaType"], "application/vnd.oci.image.config.v1+json"),
            "the config has media type",
        ),
        (_set(["config", "digest"], "md5:abc"), "the config has digest"),
        (lambda m: m["layers"].append(dict(m["layers"][0])), "2 layers"),
        (_set(["layers"], []), "0 layers"),
        (
            _set(["layers", 0, "mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip"),
            "the layer has media type",
        ),
        (_set(["layers", 0, "size"], -1), "size"),
        (_set(["layers", 0, "annotations"], {}), "not a wheel file name"),
        (
            _set(
                ["layers", 0, "annotations", "org.opencontainers.image.title"],
                "../../evil-1-py3-none-any.whl",
            ),
            "not a wheel",
        ),
    ],
)
def test_a_manifest_that_is_not_a_wheel_artifact_is_refused(change, needle):
    with pytest.raises(ArtifactRefused) as exc:
        check_manifest(_manifest(change), REF)
    line = exc.value.one_line()
    assert needle in line and REF in line and "fix:" in line and len(line.splitlines()) == 1


def test_garbage_is_refused():
    with pytest.raises(ArtifactRefused):
        check_manifest(b"<html>", REF)


@pytest.mark.parametrize(
    "meta, needle",
    [
        ({**META, "key": "0" * 64}, "records key"),
        ({**META, "inputs": {**INPUTS, "archs": ["100"]}}, "inputs hash to"),
        ({**META, "inputs": {**INPUTS, "torch": 2.11}}, "cannot be hashed"),
        ({**META, "filename": "apex-0.2-cp312-cp312-linux_x86_64.whl"}, "names"),
        ({**META, "sha256": "cd" * 32}, "is not the wheel its config records"),
        ({**META, "size": 99}, "is not the wheel its config records"),
    ],
)
def test_a_config_that_does_not_vouch_for_the_layer_is_refused(meta, needle):
    _, layer, name = check_manifest(_manifest(), REF)
    with pytest.raises(ArtifactRefused) as exc:
        check_config(canonical(meta), KEY, layer, name, REF)
    assert needle in exc.value.one_line()


def test_only_network_trouble_and_server_errors_are_retried():
    import requests

    refused = RegistryUnreachable("h", "x", requests.exceptions.ConnectionError("Connection refused"))
    dns = RegistryUnreachable("h", "x", requests.exceptions.ConnectionError("Name or service not known"))
    assert wheelshare._transient(refused) and not wheelshare._transient(dns)
    assert wheelshare._transient(RegistryHTTPError("m", 503)) and wheelshare._transient(
        RegistryHTTPError("m", 429)
    )
    assert not wheelshare._transient(RegistryHTTPError("m", 401))
    assert not wheelshare._transient(ArtifactRefused(REF, "x"))


def test_pull_answers_from_the_cache_without_the_network(tmp_path):
    from tests.fixtures.wheels import make_wheel

    cache = WheelCache(tmp_path / "cache")
    entry = cache.put(KEY, make_wheel(tmp_path / "w"), {"inputs": INPUTS})
    # port 1 on loopback: any request would fail with RegistryUnreachable
    assert wheelshare.pull(cache, KEY, "127.0.0.1:1/mtp/ext-wheels") == entry


def test_push_of_a_key_not_cached_and_bad_repositories_are_input_errors(tmp_path):
    cache = WheelCache(tmp_path / "cache")
    with pytest.raises(InputError, match="not in the wheel cache"):
        wheelshare.push(cache, KEY, "127.0.0.1:1/mtp/ext-wheels")
    for bad in ("mtp/ext-wheels", "127.0.0.1:1/mtp/ext-wheels:tag", "127.0.0.1:1/Bad"):
        with pytest.raises(InputError):
            wheelshare._parse(bad)
    assert wheelshare.repository_for("127.0.0.1:5000/mtp") == "127.0.0.1:5000/mtp/ext-wheels"
