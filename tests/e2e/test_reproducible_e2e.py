"""End to end: the reproducible engine (buildah) and `verify`, with real buildah, dockerd and
the session's registry.

A clean build of a test profile (on a throwaway buildah storage), pushed, and `verify`'s clean
rebuild with the cache, umask, time zone and locale all different say every layer, the
config and the manifest digest are the same. A file changed in one layer and pushed under the same tag, and a profile that
is not the image's plan, each end with one error line and exit 1.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.fixtures.image_fixtures import REPO, image_world, world_cli

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        shutil.which("buildah") is None, reason="buildah not installed (scripts/setup-test-host.sh)"
    ),
]

PROFILE = "test-detach"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "repro")
    w["env"] = {**w["env"], "MTP_ENGINE": "buildah", "MTP_FASTPATH": "0"}
    return w


@pytest.fixture(scope="module")
def published(world, tmp_path_factory) -> dict:
    """The first clean build, pushed: its run's summary."""
    return _build_and_push(world, f"repro-a-{uuid.uuid4().hex[:6]}", tmp_path_factory.mktemp("repro-a"))


def _build_and_push(world, ns: str, tmp_path, *more: str, built: bool = True) -> dict:
    summary = tmp_path / f"{ns}.json"
    proc = world_cli(
        world,
        "--profile",
        PROFILE,
        "--push",
        "--registry",
        f"{world['host'].registry}/{ns}",
        "--summary-file",
        str(summary),
        *more,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    if built:  # built by buildah, checked in dockerd
        assert "buildah" in proc.stdout and "PASS   versions" in proc.stdout
    return json.loads(summary.read_text())


def _http(url: str, data: bytes | None = None, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read(), dict(resp.headers)


def _upload(base: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _, headers = _http(f"{base}/blobs/uploads/", b"", "POST")
    location = headers["Location"]
    sep = "&" if "?" in location else "?"
    url = location if location.startswith("http") else base.split("/v2/")[0] + location
    _http(f"{url}{sep}digest={digest}", data, "PUT", {"Content-Type": "application/octet-stream"})
    return digest


def _image(host: str, ns: str, tag: str) -> tuple[str, dict, dict]:
    base = f"http://{host}/v2/{ns}/mtp-verl"
    manifest = json.loads(_http(f"{base}/manifests/{tag}", headers={"Accept": OCI_MANIFEST})[0])
    config = json.loads(_http(f"{base}/blobs/{manifest['config']['digest']}")[0])
    return base, manifest, config


def _verl_tampered(base: str, manifest: dict) -> tuple[int, bytes, str]:
    """(index of the verl layer, that layer with verl/__init__.py changed, the file's path)."""
    index = len(manifest["layers"]) - 2  # the verl layer, below the mode layer
    layer = _http(f"{base}/blobs/{manifest['layers'][index]['digest']}")[0]
    out, changed = io.BytesIO(), None
    with (
        tarfile.open(fileobj=io.BytesIO(layer)) as src,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst,
    ):
        for m in src:
            data = src.extractfile(m).read() if m.isfile() else None
            if changed is None and m.isfile() and m.name.endswith("verl/__init__.py"):
                data += b"\nimport os  # tampered\n"
                m.size, changed = len(data), m.name
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    assert changed, "no verl/__init__.py in the layer"
    return index, out.getvalue(), changed.lstrip("./")


def _put(base: str, tag: str, manifest: dict) -> str:
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    _http(f"{base}/manifests/{tag}", body, "PUT", {"Content-Type": OCI_MANIFEST})
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _tamper(host: str, ns: str, tag: str) -> tuple[str, str]:
    """Change one file of the verl layer and push the image again under the same tag, as an
    attacker with push rights would; -> (the file changed, the new digest)."""
    base, manifest, config = _image(host, ns, tag)
    index, new, changed = _verl_tampered(base, manifest)
    config["rootfs"]["diff_ids"][index] = "sha256:" + hashlib.sha256(new).hexdigest()
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest["config"].update(digest=_upload(base, config_bytes), size=len(config_bytes))
    blob = gzip.compress(new, mtime=0)  # in the image's own format (gzip by default)
    manifest["layers"][index].update(digest=_upload(base, blob), size=len(blob))
    return changed, _put(base, tag, manifest)


def test_two_clean_builds_give_one_digest_and_verify_proves_it(world, published):
    """Two clean builds, the second with everything around it changed (issue #35: buildah's
    storage root used to live under MTP_CACHE_DIR, and what RUN mount targets left in the layers
    followed its location: /tmp gave empty targets, ~/.cache whited out the base's
    /var/cache/apt): the second is verify's rebuild, with its cache under /var/tmp, not
    pytest's /tmp, umask 077, another time zone and locale. Every layer, the config and the
    manifest digest the same: one image. (verify's rebuild is a clean build like any other; a
    separate second build and push before it proved nothing more and cost a CI minute.)"""
    host = world["host"].registry
    first = published
    ref = f"{first['references'][0].rsplit(':', 1)[0]}@{first['digest']}"
    proc = _verify_elsewhere(world, PROFILE, ref, "077", "Asia/Kolkata", "de_DE.UTF-8")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    layer_lines = [line for line in proc.stdout.splitlines() if line.startswith("layer ")]
    assert len(layer_lines) >= 8 and all(" same " in line for line in layer_lines), proc.stdout
    assert f"manifest       same     {first['digest']}" in proc.stdout
    assert "blobs          same     gzip zlib level 6" in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("identical: ")
    # published compressed (issue #48): gzip layers the tool made, said in the manifest
    _, manifest, config = _image(host, *_ns_digest(first))
    assert {d["mediaType"] for d in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}
    assert manifest["annotations"] == {"org.mtp-image-builder.layer-compression": "gzip zlib level 6"}
    assert not {d["digest"] for d in manifest["layers"]} & set(config["rootfs"]["diff_ids"])

    # a file changed in one layer, pushed under the same tag: verify names the layer and file
    ns, tag = first["references"][0].split("/", 1)[1].split("/mtp-verl:")
    changed, tampered = _tamper(host, ns, tag)
    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", first["references"][0])
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    differs = [line for line in proc.stdout.splitlines() if "DIFFERS" in line and line.startswith("layer ")]
    assert len(differs) == 1, proc.stdout
    assert f"    {changed}: content" in proc.stdout, proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "1 of" in errors[0] and changed in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_zstd_layers_have_one_digest_anywhere(world, published, tmp_path_factory):
    """Issue #48: the same image published in zstd, asked for by the profile's manifest field
    (builds.compression, here through --set), to the namespace that already holds its gzip
    image (from the layout the first build kept: nothing is built again), goes to its own
    tags <identity>.zstd and <profile>.zstd; the gzip tags stay. Its layers are zstd the tool
    made with its pinned libzstd; verify's clean rebuild elsewhere (other cache, umask, time
    zone, locale) compresses its layers the same way and gets the same blobs and manifest
    digest. Its config is the gzip image's: only the layer bytes differ."""
    host = world["host"].registry
    ns = _ns_digest(published)[0]
    zstd = _build_and_push(
        world, ns, tmp_path_factory.mktemp("repro-z"), "--set", "builds.compression=zstd", built=False
    )
    assert zstd["digest"] != published["digest"]
    gzip_content, gzip_profile = published["references"]
    assert zstd["references"] == [gzip_content + ".zstd", gzip_profile + ".zstd"], zstd
    assert zstd["layer_format"] == "zstd"
    assert _image(host, ns, PROFILE)[1] == _image(host, ns, published["digest"])[1]  # gzip's tag stays
    _, manifest, _ = _image(host, ns, zstd["digest"])
    _, gz, _ = _image(host, *_ns_digest(published))
    assert {d["mediaType"] for d in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}
    assert manifest["annotations"] == {"org.mtp-image-builder.layer-compression": "zstd libzstd level 9"}
    assert manifest["config"] == gz["config"]
    zsize, gsize = (sum(d["size"] for d in m["layers"]) for m in (manifest, gz))
    assert zsize < gsize, (zsize, gsize)
    ref = f"{host}/{ns}/mtp-verl@{zstd['digest']}"
    proc = _verify_elsewhere(world, PROFILE, ref, "027", "America/Sao_Paulo", "C.UTF-8")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"manifest       same     {zstd['digest']}" in proc.stdout, proc.stdout
    assert "blobs          same     zstd libzstd level 9" in proc.stdout, proc.stdout


def test_a_build_on_the_layer_cache_reuses_what_did_not_change_and_is_a_cold_builds_image(
    world, published, tmp_path_factory
):
    """Issue #48 item 3. After the published test-detach build (which filled the layer cache),
    test-load-only shares its lower layers: those steps are served from the cache ("Using
    cache"), only the steps above run, and its steps go to a registry cache (--cache-to).
    verify's cold rebuild elsewhere (a clean builder, another cache, umask, time zone, locale)
    gives the same digest. Then, as on another machine (the layer cache emptied, the image gone
    from dockerd), the same build with --cache-from takes every step from the registry ("Cache
    pulled from remote") and gives the same digest again."""
    from mtpimage.engine import buildahengine

    host = world["host"].registry
    cache = f"type=registry,ref={host}/repro-cache-{uuid.uuid4().hex[:6]}/mtp-verl:buildcache"

    def build(ns: str, *more: str) -> tuple[str, str]:
        summary = tmp_path_factory.mktemp(ns) / "s.json"
        proc = world_cli(
            world,
            "--profile",
            "test-load-only",
            "--push",
            "--registry",
            f"{host}/{ns}",
            "--summary-file",
            str(summary),
            *more,
        )
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        # buildah's own output, as the build streams it (stderr: stdout may be a --json document)
        return json.loads(summary.read_text())["digest"], proc.stderr

    ns = f"repro-c-{uuid.uuid4().hex[:6]}"
    digest, log = build(ns, "--cache-to", cache)
    steps = [line for line in log.splitlines() if line.startswith("STEP ")]
    reused = log.count("--> Using cache")
    assert reused >= 3 and len(steps) - 1 > reused, log[-4000:]  # STEP 1 is FROM
    assert "--> Pushing cache" in log, log[-4000:]
    proc = _verify_elsewhere(
        world, "test-load-only", f"{host}/{ns}/mtp-verl@{digest}", "077", "Europe/Berlin", "C.UTF-8"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"manifest       same     {digest}" in proc.stdout, proc.stdout

    # another machine: an empty layer cache, the image not in dockerd
    scratch = buildahengine.SCRATCH_PARENT / f"mtp-image-builder-{os.getuid()}" / "buildah"
    buildahengine.remove_root(scratch / buildahengine.CACHE_NAME)
    image_id = (
        world["host"].docker("image", "inspect", "-f", "{{.Id}}", "mtp-verl:test-load-only").stdout.strip()
    )
    world["host"].docker("image", "rm", "-f", image_id, check=False)
    again, log = build(f"repro-d-{uuid.uuid4().hex[:6]}", "--cache-from", cache)
    # buildah 1.28 took 3 or more steps from the registry in one run here and 1 in a fresh-clone
    # CI run (it then ran the rest: not understood yet); either way the result is the same image
    assert log.count("--> Cache pulled from remote") >= 1, log[-4000:]
    assert again == digest


def test_verify_refuses_an_image_of_another_plan(world, published):
    first = published
    ref = f"{first['references'][0].rsplit(':', 1)[0]}@{first['digest']}"
    proc = world_cli(world, "verify", "--profile", "test-load-only", "--image", ref)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "built from test-detach-" in errors[0] and "nothing was rebuilt" in errors[0]
    assert "layer " not in proc.stdout and "Traceback" not in proc.stderr


def _ns_digest(summary: dict) -> tuple[str, str]:
    """The published image by its digest: an earlier test pushes a tampered image under the
    published tag (as an attacker would), so the tag is not the published image any more."""
    return summary["references"][0].split("/", 1)[1].split("/mtp-verl:")[0], summary["digest"]


def test_verify_refuses_a_swapped_layer_blob_under_an_untouched_config(world, published):
    """The manifest names another blob for the verl layer; config and diff IDs untouched (a
    pull of such an image installs the tampered file): refused as such, nothing rebuilt."""
    host = world["host"].registry
    ns, digest = _ns_digest(published)
    base, manifest, config = _image(host, ns, digest)
    index, new, changed = _verl_tampered(base, manifest)
    blob = gzip.compress(new, mtime=0)
    manifest["layers"][index] = {
        "digest": _upload(base, blob),
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "size": len(blob),
    }
    _put(base, "swapped", manifest)
    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", f"{host}/{ns}/mtp-verl:swapped")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "the image in the registry is not the one its config describes" in errors[0]
    assert f"layer {index + 1} (blob {manifest['layers'][index]['digest']}) unpacks to" in errors[0]
    assert "sha256:" + hashlib.sha256(new).hexdigest() in errors[0]
    assert config["rootfs"]["diff_ids"][index] in errors[0] and f"{changed} (content)" in errors[0]
    assert "rebuilding" not in proc.stderr and "Traceback" not in proc.stderr
    assert f"    {changed}: content" in proc.stdout, proc.stdout


def test_verify_names_the_files_of_a_layer_added_on_top(world, published):
    """What `docker run` + `docker commit` + push under the same tag make: a gzip layer on
    top that changes a file, adds one and removes one; verify names each."""
    host = world["host"].registry
    ns, digest = _ns_digest(published)
    base, manifest, config = _image(host, ns, digest)
    _, tampered, changed = _verl_tampered(base, manifest)
    with tarfile.open(fileobj=io.BytesIO(tampered)) as src:
        files = {m.name.lstrip("./"): m for m in src if m.isfile()}
        data = src.extractfile(files[changed]).read()
    gone = next(p for p in sorted(files) if p != changed and "/" in p)  # another file of the layer
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parent, _, name = gone.rpartition("/")
        whiteout = f"{parent}/.wh.{name}"
        for path, content in (
            (changed, data),
            ("usr/local/bin/evil", b"#!/bin/sh\n"),
            (whiteout, b""),
        ):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), 0o755
            tar.addfile(info, io.BytesIO(content))
    layer = out.getvalue()
    blob = gzip.compress(layer, mtime=0)
    manifest["layers"].append(
        {
            "digest": _upload(base, blob),
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "size": len(blob),
        }
    )
    config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(layer).hexdigest())
    config["history"].append({"created_by": "/bin/sh -c echo evil > /usr/local/bin/evil"})
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest["config"].update(digest=_upload(base, config_bytes), size=len(config_bytes))
    _put(base, "ontop", manifest)
    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", f"{host}/{ns}/mtp-verl:ontop")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    n = len(manifest["layers"])
    assert f"layer {n:>2}/{n}  DIFFERS" in proc.stdout, proc.stdout
    assert f"    {changed}: changed: content" in proc.stdout, proc.stdout
    assert "    usr/local/bin/evil: added" in proc.stdout and f"    {gone}: removed" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"layer {n} (echo evil" in errors[0], proc.stderr[-3000:]
    assert "not in the rebuild, on top of it:" in errors[0] and "usr/local/bin/evil (added)" in errors[0]


def test_verify_names_the_file_of_a_docker_commit_pushed_by_docker(world, published):
    """Issue #46: the image pulled with docker, changed with `docker run` + `docker commit` and
    pushed back with docker under a tag. docker 20.10 reuses the blobs it pulled (here
    uncompressed tars) under a gzip media type; verify said "registry cannot be reached"
    (exit 3). It reads each blob as what it is, names the media types that do not match, and
    names the file the commit changed."""
    host = world["host"]
    ns, digest = _ns_digest(published)
    base, manifest, config = _image(host.registry, ns, digest)
    # Another image ID (a config field no check reads): dockerd here has the published image
    # (the build loaded it), and `docker pull` of an image it has downloads nothing, so docker
    # would know no blob to reuse; a machine without the image downloads every layer, as here.
    config["author"] = f"mtp e2e {uuid.uuid4().hex[:8]}"
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest["config"].update(digest=_upload(base, config_bytes), size=len(config_bytes))
    # its layers as uncompressed tars (as `--compression none` publishes them): docker 20.10
    # pulls them and pushes them back under a gzip media type
    manifest.pop("annotations", None)
    for desc in manifest["layers"]:
        tar = gzip.decompress(_http(f"{base}/blobs/{desc['digest']}")[0])
        desc.update(
            digest=_upload(base, tar), size=len(tar), mediaType="application/vnd.oci.image.layer.v1.tar"
        )
    pinned = f"{host.registry}/{ns}/mtp-verl@{_put(base, 'pulled', manifest)}"
    committed = f"{host.registry}/{ns}/mtp-verl:committed"
    name = f"mtp-commit-{uuid.uuid4().hex[:8]}"
    try:
        host.docker("pull", pinned, timeout=600)
        try:
            host.docker(
                "run", "--name", name, "--entrypoint", "/bin/sh", pinned, "-c", "echo changed >> /etc/issue"
            )
            host.docker("commit", name, committed)
        finally:
            host.docker("rm", "-f", name, check=False)
        host.docker("push", committed, timeout=600)
    finally:
        host.docker("image", "rm", committed, pinned, check=False)
    docker_v2 = "application/vnd.docker.distribution.manifest.v2+json"
    body, _ = _http(
        f"http://{host.registry}/v2/{ns}/mtp-verl/manifests/committed", headers={"Accept": docker_v2}
    )
    pushed = json.loads(body)["layers"]
    reused = [d for d in pushed if d["digest"] in config["rootfs"]["diff_ids"]]
    assert reused and all(d["mediaType"].endswith("gzip") for d in reused), pushed  # docker 20.10's form

    proc = world_cli(world, "verify", "--profile", PROFILE, "--image", committed)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    assert "cannot be reached" not in proc.stderr and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "not in the rebuild, on top of it:" in errors[0] and "etc/issue (changed: content" in errors[0]
    assert "does not match the bytes (an uncompressed tar)" in errors[0], errors[0]
    assert "    etc/issue: changed: content" in proc.stdout, proc.stdout
    notes = [
        line for line in proc.stdout.splitlines() if "does not match the bytes (an uncompressed tar)" in line
    ]
    assert len(notes) == len(reused), proc.stdout


def _verify_elsewhere(world, profile: str, ref: str, umask: str, tz: str, lang: str):
    """`verify` from a cache of its own under /var/tmp (not pytest's /tmp), with another umask,
    time zone and locale: as on another machine."""
    elsewhere = Path(tempfile.mkdtemp(prefix="mtp-e2e-", dir="/var/tmp"))
    try:
        return _run_elsewhere(
            world, ["verify", "--profile", profile, "--image", ref], elsewhere / "cache", umask, tz, lang
        )
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def _run_elsewhere(world, args: list[str], cache: Path, umask: str, tz: str, lang: str):
    """build.py ARGS with its own cache location, umask, time zone and locale."""
    env = {**os.environ, **world["env"], "MTP_CACHE_DIR": str(cache), "TZ": tz, "LANG": lang, "LC_ALL": lang}
    env.pop("MTP_DEBUG", None)
    argv = [sys.executable, str(REPO / "build.py"), "--manifests", world["manifests"], *args]
    return subprocess.run(
        ["sh", "-c", f'umask {umask}; exec "$@"', "sh", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
