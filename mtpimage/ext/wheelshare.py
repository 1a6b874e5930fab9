"""Sharing the extension wheel cache (wheelcache.py) through an OCI registry, so a wheel
compiled once (here, on a bigger builder, in CI) is never compiled again elsewhere.

One artifact per key, tagged with the full 64-hex key in a repository such as
`127.0.0.1:5000/mtp/ext-wheels`:
    manifest  application/vnd.oci.image.manifest.v1+json, artifactType ARTIFACT_TYPE
    config    the entry's meta.json as canonical JSON (CONFIG_TYPE): key inputs, built_by,
              key, filename, sha256 and size of the wheel
    layer     the wheel's bytes (LAYER_TYPE), annotated with its file name (TITLE)
Standard tooling reads it (`oras pull REPO:KEY`, or curl of the manifest and blobs).

A pull trusts nothing it did not check: the manifest's form, the config's digest, the key in
the config (and its inputs hash to it), the layer's digest and size, and the layer against
the sha256 the config records. Only then does the wheel enter the local cache (put()).
A push never replaces a registry's wheel for a key with different bytes: the first writer
wins there as in the local cache. Every request retries under the network policy.
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from mtpimage import netpolicy
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.ext.wheelcache import CachedWheel, WheelCache, cache_key, check_key, valid_filename
from mtpimage.ext.wheelpins import Pin, PinMismatch
from mtpimage.imageref import ImageRef, Registry
from mtpimage.publish import digests
from mtpimage.publish.registryclient import RegistryClient
from mtpimage.publish.registryclient import transient as _transient

REPOSITORY = "ext-wheels"  # under a --registry HOST[:PORT]/NAMESPACE
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.mtp-image-builder.wheel.v1"
CONFIG_TYPE = "application/vnd.mtp-image-builder.wheel.config.v1+json"
LAYER_TYPE = "application/vnd.mtp-image-builder.wheel.v1+zip"
TITLE = "org.opencontainers.image.title"
KEY_ANNOTATION = "io.mtp-image-builder.wheel.key"
MAX_CONFIG_BYTES = 1 << 20  # a meta.json is a few kB; more is not ours


class ArtifactRefused(EnvironmentProblem):
    """What the registry holds for a key is not a wheel this tool would install. Never
    retried: asking again gets the same bytes."""

    def __init__(self, ref: str, problem: str):
        super().__init__(
            f"registry artifact {ref} refused: {problem} (fix: the registry's copy is not what was "
            "pushed: delete that tag and push the key again from a machine whose cache holds it "
            "(`build.py wheels push`), or build it here)"
        )


def repository_for(registry: str) -> str:
    """HOST[:PORT]/NAMESPACE (a --registry) -> the wheel repository under it."""
    return Registry.parse(registry).ref(REPOSITORY)


def _parse(repository: str) -> tuple[RegistryClient, str, str]:
    """-> (client, repository path on the registry, HOST/PATH for messages)."""
    ref = ImageRef.parse(repository, flag="wheel repository")
    if not ref.explicit_host or ref.tag or ref.digest:
        raise InputError(
            "wheel repository",
            repository,
            "expected HOST[:PORT]/NAMESPACE/NAME, without tag or digest",
            f"for example 127.0.0.1:5000/mtp/{REPOSITORY}",
        )
    return RegistryClient(Registry(ref.host, "")), ref.path, ref.repository


def repository_tags(repository: str) -> list[str]:
    """The tags of a wheel repository ([] when it does not exist), under the network policy."""
    client, path, _ = _parse(repository)
    return _net(client.tags, path)


def _net(fn, *args):
    return netpolicy.retrying(_transient)(fn, *args)


def canonical(meta: dict) -> bytes:
    """The config blob: the same meta always gives the same bytes, so the same digest."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def artifact_manifest(key: str, config: bytes, wheel_sha256: str, size: int, filename: str) -> bytes:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": CONFIG_TYPE,
            "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": LAYER_TYPE,
                "digest": f"sha256:{wheel_sha256}",
                "size": size,
                "annotations": {TITLE: filename},
            }
        ],
        "annotations": {KEY_ANNOTATION: key},
    }
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def _descriptor(d, media_type: str, where: str, ref: str) -> dict:
    if not isinstance(d, dict) or d.get("mediaType") != media_type:
        got = d.get("mediaType") if isinstance(d, dict) else d
        raise ArtifactRefused(ref, f"{where} has media type {got!r}, expected {media_type}")
    digest, size = d.get("digest"), d.get("size")
    if not (digests.valid(digest) and digest.startswith("sha256:")):  # the wheel's own sha256 is one
        raise ArtifactRefused(ref, f"{where} has digest {digests.excerpt(digest)}, expected sha256:<64 hex>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ArtifactRefused(ref, f"{where} has size {size!r}")
    return d


def check_manifest(body: bytes, ref: str) -> tuple[dict, dict, str]:
    """-> (config descriptor, wheel layer descriptor, wheel file name), or ArtifactRefused."""
    try:
        m = json.loads(body)
    except ValueError:
        raise ArtifactRefused(ref, "the manifest is not JSON") from None
    if not isinstance(m, dict) or m.get("schemaVersion") != 2 or m.get("mediaType") != OCI_MANIFEST:
        raise ArtifactRefused(ref, f"not an OCI image manifest (expected mediaType {OCI_MANIFEST})")
    if m.get("artifactType") != ARTIFACT_TYPE:
        raise ArtifactRefused(ref, f"artifactType {m.get('artifactType')!r}, expected {ARTIFACT_TYPE}")
    config = _descriptor(m.get("config"), CONFIG_TYPE, "the config", ref)
    layers = m.get("layers")
    if not isinstance(layers, list) or len(layers) != 1:
        raise ArtifactRefused(
            ref, f"{len(layers) if isinstance(layers, list) else 'no'} layers, expected one wheel"
        )
    layer = _descriptor(layers[0], LAYER_TYPE, "the layer", ref)
    name = (layer.get("annotations") or {}).get(TITLE)
    if not isinstance(name, str) or not valid_filename(name):
        raise ArtifactRefused(ref, f"the layer's {TITLE} {name!r} is not a wheel file name")
    return config, layer, name


def check_config(config: bytes, key: str, layer: dict, filename: str, ref: str) -> dict:
    """The config's meta, once it names this key, this wheel file and this layer's bytes."""
    try:
        meta = json.loads(config)
    except ValueError:
        raise ArtifactRefused(ref, "the config is not JSON") from None
    if not isinstance(meta, dict):
        raise ArtifactRefused(ref, "the config is not a JSON object")
    if meta.get("key") != key:
        raise ArtifactRefused(ref, f"its config records key {meta.get('key')!r}, not the tag's {key}")
    if "inputs" in meta:
        try:
            actual = cache_key(meta["inputs"])
        except ValueError as exc:
            raise ArtifactRefused(ref, f"its config's inputs cannot be hashed ({exc})") from None
        if actual != key:
            raise ArtifactRefused(ref, f"its config's inputs hash to {actual}, not to the key")
    if meta.get("filename") != filename:
        raise ArtifactRefused(ref, f"its config names {meta.get('filename')!r}, the layer {filename}")
    if f"sha256:{meta.get('sha256')}" != layer["digest"] or meta.get("size") != layer["size"]:
        raise ArtifactRefused(
            ref,
            f"the layer {layer['digest']} ({layer['size']} bytes) is not the wheel its config records "
            f"(sha256:{meta.get('sha256')}, {meta.get('size')} bytes)",
        )
    return meta


def push(
    cache: WheelCache,
    key: str,
    repository: str,
    say: Callable[[str], None] | None = None,
    pin: Pin | None = None,
) -> str:
    """Push the cached wheel of `key` as an artifact tagged `key`; -> REPO:KEY@sha256:...
    Blobs the registry has are not sent again. When the registry already holds a wheel
    artifact for the key, nothing is pushed and its reference is returned (with other bytes,
    `say` is told: the registry's copy stays, as in the local cache the first writer wins).
    `pin`: the key's reviewed wheel (wheelpins.py); a cache entry whose bytes are not it is
    refused (PinMismatch) before the registry is asked anything, as pull and builds refuse it."""
    check_key(key)
    entry = cache.get(key)
    if entry is None:
        raise InputError(
            "wheel key",
            key,
            f"not in the wheel cache {cache.root}",
            "build it, or `wheels pull` it from a registry",
        )
    if pin is not None and entry.sha256 != pin.sha256:
        raise PinMismatch(
            f"wheel cache entry {cache.root / key}",
            key,
            entry.sha256,
            pin,
            f"nothing was pushed; the cache's wheel is not the reviewed one: `build.py wheels remove "
            f"{key[:12]}`, then pull or build it again",
        )
    client, path, name = _parse(repository)
    ref = f"{name}:{key}"
    there = _net(client.manifest, path, key, OCI_MANIFEST)
    if there is not None:
        try:
            _, layer, _ = check_manifest(there[0], ref)
        except ArtifactRefused:
            layer = None  # not a wheel artifact: ours replaces it
        if layer is not None:
            if layer["digest"] != f"sha256:{entry.sha256}" and say:
                say(
                    f"note: {ref} already holds another build of this key ({layer['digest']}; "
                    f"this cache has sha256:{entry.sha256}); the registry's copy stays"
                )
            return f"{ref}@{there[1]}"
    config = canonical(entry.meta)
    blobs = [(f"sha256:{entry.sha256}", entry.path), ("sha256:" + hashlib.sha256(config).hexdigest(), config)]
    for digest, body in blobs:
        if not _net(client.blob_exists, path, digest):
            _net(client.upload_blob, path, digest, body)
    manifest = artifact_manifest(key, config, entry.sha256, entry.size, entry.filename)
    digest = _net(client.put_manifest, path, key, manifest, OCI_MANIFEST)
    return f"{ref}@{digest}"


def pull(cache: WheelCache, key: str, repository: str, pin: Pin | None = None) -> CachedWheel | None:
    """The wheel of `key`: from the local cache when there, else from the registry's artifact,
    verified and put() into the cache. None when the registry has no artifact for the key.
    `pin`: the key's reviewed wheel (wheelpins.py); any other wheel is refused (PinMismatch),
    a registry's before its bytes are downloaded, whatever its config records."""
    check_key(key)
    local = cache.get(key)
    if local is not None:
        if pin is not None and local.sha256 != pin.sha256:
            raise PinMismatch(
                f"wheel cache entry {cache.root / key}",
                key,
                local.sha256,
                pin,
                f"the cache's wheel is not the reviewed one: `build.py wheels remove {key[:12]}`, then pull it again",
            )
        return local
    client, path, name = _parse(repository)
    got = _net(client.manifest, path, key, OCI_MANIFEST)
    if got is None:
        return None
    body, manifest_digest = got
    ref = f"{name}:{key}@{manifest_digest}"
    config_desc, layer, filename = check_manifest(body, ref)
    if config_desc["size"] > MAX_CONFIG_BYTES:
        raise ArtifactRefused(ref, f"its config is {config_desc['size']} bytes (at most {MAX_CONFIG_BYTES})")
    buf = io.BytesIO()
    digest, size = _net(client.fetch_blob, path, config_desc["digest"], buf, config_desc["size"])
    if digest != config_desc["digest"] or size != config_desc["size"]:
        raise ArtifactRefused(
            ref, f"its config blob came as {digest} ({size} bytes), not {config_desc['digest']}"
        )
    meta = check_config(buf.getvalue(), key, layer, filename, ref)
    if pin is not None and layer["digest"] != f"sha256:{pin.sha256}":
        raise PinMismatch(
            f"registry artifact {ref}",
            key,
            layer["digest"].split(":", 1)[1],
            pin,
            "the registry's copy is not the reviewed wheel: delete that tag and push the key again from "
            "a machine whose wheel is the pin, or build it here",
        )
    cache.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-pull-", dir=cache.root) as tmp:
        wheel = Path(tmp) / filename
        with open(wheel, "wb") as out:
            digest, size = _net(client.fetch_blob, path, layer["digest"], out, layer["size"])
        if digest != layer["digest"] or size != layer["size"]:
            raise ArtifactRefused(
                ref,
                f"its wheel blob came as {digest} ({size} bytes), not {layer['digest']} ({layer['size']} bytes)",
            )
        return cache.put(key, wheel, {**meta, "pulled_from": ref})
