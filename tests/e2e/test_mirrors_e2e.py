"""End to end, issue #37 item 1: building where PyPI and the base's registry are reachable only
through a site's mirrors. Real dockerd, BuildKit, buildah and registries, all on loopback.

The test profile gets one package from an index (`mtp-mirror-probe`, a small real wheel made
here), so every build fetches a Python file by its locked sha256. The "real hosts" are
loopback servers the test controls: an origin index (an HTTP directory, PEP 503 pages) and an
origin registry; the mirrors are a second HTTP server with the same files (its URL carries a
user and token, as a site's often does) and a path of the session's registry holding the
base by its digest.

  1. Manifests naming hosts that do not resolve (`pypi.origin.invalid`,
     `registry.origin.invalid`): locked through the origin index, built (docker engine)
     through both mirrors alone. The image passes its checks; the mirror served the wheel;
     no layer, label, history entry or log line holds the mirror or its token; the identity
     is the one rendered without mirrors.
  2. The mirror serving a wheel whose sha256 is not the lock's, an index mirror that does
     not answer, and a registry mirror without the base: each one line naming the setting.
  3. `--reproducible` (buildah): built and pushed with the origins up and no mirror; then,
     with the origins stopped, `verify` rebuilds it through the mirrors alone and finds every
     layer, the config and the manifest digest identical: the image built through a mirror is
     bit for bit the one built without. (verify's rebuild is the build through the mirrors; a
     separate build and push through them proved nothing more and cost a CI minute.)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from mtpimage.demo.registry import private_registry
from tests.fixtures.dockerhost import remove_session_images
from tests.fixtures.image_fixtures import BASE_TAG, image_world, world_cli
from tests.fixtures.servers import HttpFileServer
from tests.fixtures.wheels import make_wheel

pytestmark = pytest.mark.timeout(3000)

PROFILE, OTHER = "test-detach", "test-load-only"
PACKAGE, MODULE = "mtp-mirror-probe", "mtp_mirror_probe"
ORIGIN_INDEX = "https://pypi.origin.invalid/simple"  # never resolves (RFC 6761)
ORIGIN_REGISTRY = "registry.origin.invalid"
TOKEN = f"tok{uuid.uuid4().hex[:10]}"  # in the mirror's URL: must never be seen anywhere
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


# ----------------------------------------------------------------------------- helpers
def _http(url: str, data: bytes | None = None, method: str = "GET", headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read(), dict(resp.headers)


def copy_image(src: str, src_repo: str, digest: str, dst: str, dst_repo: str, tag: str) -> None:
    """The image `src/src_repo@digest` into `dst/dst_repo` byte for byte, through the registry
    API (docker would keep local references of the copy, and then never pull from it)."""
    manifest, headers = _http(
        f"http://{src}/v2/{src_repo}/manifests/{digest}", headers={"Accept": MANIFEST_TYPES}
    )
    assert "sha256:" + hashlib.sha256(manifest).hexdigest() == digest
    doc = json.loads(manifest)
    for blob in [doc["config"], *doc["layers"]]:
        data, _ = _http(f"http://{src}/v2/{src_repo}/blobs/{blob['digest']}")
        _, up = _http(f"http://{dst}/v2/{dst_repo}/blobs/uploads/", b"", "POST")
        location = up["Location"]
        url = location if location.startswith("http") else f"http://{dst}{location}"
        sep = "&" if "?" in url else "?"
        _http(f"{url}{sep}digest={blob['digest']}", data, "PUT", {"Content-Type": "application/octet-stream"})
    for ref in (tag, digest):
        _http(
            f"http://{dst}/v2/{dst_repo}/manifests/{ref}",
            manifest,
            "PUT",
            {"Content-Type": headers.get("Content-Type") or doc["mediaType"]},
        )


def index_files(root: Path, payload) -> Path:
    """A PEP 503 index of one project under root/simple (directory pages list its file);
    `payload`: the module's text, or a wheel's bytes to serve as they are."""
    if isinstance(payload, bytes):
        path = root / "simple" / PACKAGE / f"{MODULE}-0.1-py3-none-any.whl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        return path
    return make_wheel(root / "simple" / PACKAGE, name=MODULE, version="0.1", payload=payload)


def set_origins(manifests: Path, base_name: str, index_url: str) -> None:
    """The copy's base image name and index URL (the digest stays), and the probe package in
    the stack of every test profile."""
    path = manifests / "components.yaml"
    cat = yaml.safe_load(path.read_text())
    cat["platform"]["base_image"]["name"] = base_name
    cat["indexes"]["pypi"] = index_url
    cat["packages"] = {PACKAGE: {"version": "0.1", "layer": "verl"}}
    path.write_text(yaml.safe_dump(cat, sort_keys=False))
    base = manifests / "profiles" / "base.yaml"
    prof = yaml.safe_load(base.read_text())
    prof["stack"]["packages"] = [PACKAGE]
    base.write_text(yaml.safe_dump(prof, sort_keys=False))


def copy_world(world: dict, dest: Path, base_name: str, index_url: str) -> dict:
    shutil.copytree(world["manifests"], dest)
    set_origins(dest, base_name, index_url)
    return {**world, "manifests": str(dest), "env": dict(world["env"])}


def cli(world: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    return world_cli({**world, "env": {**world["env"], **env}}, *args)


def errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def identity(world: dict, profile: str) -> str:
    """The identity `render` gives in the world's environment without any mirror."""
    proc = cli(
        world, "render", "--profile", profile, "--json", "--out", str(Path(world["manifests"]).parent / "r")
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["identity"]


def drop_local(world: dict, *refs: str) -> None:
    for ref in refs:
        world["host"].docker("image", "rm", "--no-prune", ref, check=False)


# ----------------------------------------------------------------------------- the world
@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "mirrors")
    w["env"] = {**w["env"], "MTP_FASTPATH": "0", "MTP_NET_RETRIES": "1", "MTP_HTTP_TIMEOUT": "10"}
    reg = docker_host.registry
    name, _, digest = w["base"].partition("@")
    # the registry mirror: a path of the session's registry, holding the base by its digest
    copy_image(reg, name.split("/", 1)[1], digest, reg, "mirror/mtp-test/base", BASE_TAG)
    payload = f"VALUE = {uuid.uuid4().int % 10**9}\n"  # new bytes each run: no cache hit hides a fetch
    with (
        HttpFileServer(tmp_path_factory.mktemp("origin-index")) as origin,
        HttpFileServer(tmp_path_factory.mktemp("mirror-index")) as mirror,
        HttpFileServer(tmp_path_factory.mktemp("bad-mirror-index")) as bad,
    ):
        wheel = index_files(origin.root, payload)
        assert index_files(mirror.root, payload).read_bytes() == wheel.read_bytes()
        index_files(bad.root, payload + "# rebuilt under the same name\n")
        prefixes = [f"{ORIGIN_REGISTRY}/"]
        try:
            yield {
                **w,
                "digest": digest,
                "origin": origin,
                "mirror": mirror,
                "bad": bad,
                "wheel": wheel,
                "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                "mirror_registry": f"{reg}/mirror",
                "prefixes": prefixes,
            }
        finally:
            remove_session_images(docker_host.cli, prefixes)


def with_token(server: HttpFileServer) -> str:
    return f"http://mirror-user:{TOKEN}@127.0.0.1:{server.port}/simple"


# ----------------------------------------------------------------------------- 1. names that do not resolve
@pytest.fixture(scope="module")
def air_gapped(world, tmp_path_factory) -> dict:
    """Manifests whose index and base registry do not resolve, locked through the origin
    index (the lock keeps the manifests' URL), then built through the mirrors alone."""
    w = copy_world(
        world,
        tmp_path_factory.mktemp("air-gapped") / "manifests",
        f"{ORIGIN_REGISTRY}/mtp-test/base",
        ORIGIN_INDEX,
    )
    locked = cli(w, "lock", MTP_INDEX_REWRITE=f"{ORIGIN_INDEX}={world['origin'].url_for('simple')}")
    assert locked.returncode == 0, (locked.stdout + locked.stderr)[-3000:]
    lock = yaml.safe_load((Path(w["manifests"]) / "lock.yaml").read_text())
    assert ORIGIN_INDEX in json.dumps(lock) and "127.0.0.1" not in json.dumps(lock.get("packages"))
    w["mirrors"] = {
        "MTP_INDEX_REWRITE": f"{ORIGIN_INDEX}={with_token(world['mirror'])}",
        "MTP_REGISTRY_MIRROR": f"{ORIGIN_REGISTRY}={world['mirror_registry']}",
    }
    w["identity"] = identity(w, PROFILE)
    return w


def test_a_sha256_other_than_the_locks_from_the_mirror_is_refused_in_one_line(world, air_gapped):
    """First in the module: its failed build leaves the layers below the wheel's step in
    BuildKit's cache, and the good build after it reuses them."""
    bad = {**air_gapped["mirrors"], "MTP_INDEX_REWRITE": f"{ORIGIN_INDEX}={with_token(world['bad'])}"}
    proc = cli(air_gapped, "--profile", PROFILE, **bad)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    [line] = errors(proc)
    got = hashlib.sha256(
        (world["bad"].root / "simple" / PACKAGE / world["wheel"].name).read_bytes()
    ).hexdigest()
    assert f"has sha256 {got}, lock.yaml pins {world['sha256']}" in line, line
    assert "the index mirror that MTP_INDEX_REWRITE sends pip to serves other bytes" in line
    assert TOKEN not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert (
        world["host"].docker("image", "inspect", f"mtp-verl:{air_gapped['identity']}", check=False).returncode
        != 0
    )


@pytest.fixture(scope="module")
def built(world, air_gapped) -> dict:
    world["origin"].stop()  # from here on nothing answers for the origin index
    before = len(world["mirror"].requests)
    proc = cli(air_gapped, "--profile", PROFILE, **air_gapped["mirrors"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return {
        "proc": proc,
        "image": f"mtp-verl:{air_gapped['identity']}",
        "requests": world["mirror"].requests[before:],
    }


def test_an_image_builds_through_both_mirrors_alone(world, air_gapped, built):
    out = built["proc"].stdout
    assert f"image   mtp-verl:{air_gapped['identity']}" in out  # the identity rendered without mirrors
    assert "PASS   versions" in out and "PASS   imports" in out, out[-3000:]
    assert f"mirrors {ORIGIN_INDEX} -> http://****@127.0.0.1:{world['mirror'].port}/simple" in out
    # the wheel came from the mirror (the origin is stopped and its name does not resolve)
    assert any(path.endswith(world["wheel"].name) for _m, path, _s in built["requests"]), built["requests"]
    shown = world["host"].docker(
        "run", "--rm", built["image"], "python", "-c", f"import {MODULE}; print({MODULE}.VALUE)"
    )
    assert shown.stdout.strip() and shown.returncode == 0


def test_the_mirrors_are_in_no_layer_label_history_or_log(world, air_gapped, built, tmp_path):
    image = built["image"]
    host = world["host"]
    leaks = (TOKEN, f"127.0.0.1:{world['mirror'].port}", world["mirror_registry"], "mirror-user")
    inspect = host.docker("image", "inspect", image).stdout
    history = host.docker("history", "--no-trunc", image).stdout
    for text in (inspect, history):
        assert not [x for x in leaks if x in text], [x for x in leaks if x in text]
    # the run may say where it fetched from (its `mirrors` line, BuildKit's FROM), never the token
    for text in (built["proc"].stdout, built["proc"].stderr):
        assert TOKEN not in text and "mirror-user" not in text
    labels = json.loads(inspect)[0]["Config"]["Labels"]
    assert labels["org.opencontainers.image.base.name"] == f"{ORIGIN_REGISTRY}/mtp-test/base:{BASE_TAG}"
    # every byte of every layer
    saved = tmp_path / "image.tar"
    with open(saved, "wb") as f:
        subprocess.run([host.cli, "save", image], stdout=f, check=True, timeout=600)
    with tarfile.open(saved) as outer:
        for member in outer:
            if member.isfile() and (member.name.endswith("layer.tar") or "/blobs/" in member.name):
                data = outer.extractfile(member).read()
                assert not [x for x in leaks if x.encode() in data], member.name
    logs = Path(world["env"]["MTP_CACHE_DIR"]) / "logs"
    for log in logs.glob("*.log") if logs.is_dir() else []:
        assert TOKEN not in log.read_text(errors="replace"), log


def test_an_index_mirror_that_does_not_answer_is_one_line(world, air_gapped, built):
    gone = {
        **air_gapped["mirrors"],
        "MTP_INDEX_REWRITE": f"{ORIGIN_INDEX}=http://u:{TOKEN}@127.0.0.1:9/simple",
    }
    proc = cli(air_gapped, "--profile", OTHER, **gone)
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    [line] = errors(proc)
    assert "the index mirror http://****@127.0.0.1:9/simple that MTP_INDEX_REWRITE gives for" in line, line
    assert TOKEN not in proc.stdout + proc.stderr and "build   " not in proc.stdout


def test_a_registry_mirror_without_the_base_is_one_line(world, air_gapped, built):
    lacking = {
        **air_gapped["mirrors"],
        "MTP_REGISTRY_MIRROR": f"{ORIGIN_REGISTRY}={world['host'].registry}/nowhere",
    }
    proc = cli(air_gapped, "--profile", OTHER, **lacking)
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-3000:]
    [line] = errors(proc)
    assert (
        f"base image {ORIGIN_REGISTRY}/mtp-test/base:{BASE_TAG}@{world['digest']} through its registry mirror"
        in line
    )
    assert f"{world['host'].registry}/nowhere/mtp-test/base@{world['digest']} could not be pulled" in line, (
        line
    )


# ----------------------------------------------------------------------------- 3. bit for bit, with and without
def self_signed(where: Path) -> tuple[Path, Path, Path]:
    """(a CA's certificate, a server certificate for 127.0.0.1 it signed, that key): uv
    (rustls) refuses a self-signed certificate that is its own CA."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make the origin index's certificate")
    ca, ca_key = where / "ca.pem", where / "ca.key"
    cert, key, csr = where / "origin.pem", where / "origin.key", where / "origin.csr"
    ext = where / "origin.ext"
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=120)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=mtp test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
            "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "2", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


@pytest.fixture(scope="module")
def origins(world, tmp_path_factory) -> dict:
    """Real origins on loopback, which the test can stop: a registry of its own with the
    base, and an index over https (the manifests' schema takes https indexes only), whose CA
    the build without mirrors gets with --ca-bundle."""
    import ssl

    tmp = tmp_path_factory.mktemp("origins")
    ca, cert, key = self_signed(tmp)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    index = HttpFileServer(tmp / "index", tls=tls).start()
    index_files(index.root, world["wheel"].read_bytes())
    (tmp / "registry").mkdir()
    registry = private_registry(tmp / "registry")
    address = registry.__enter__()
    world["prefixes"].append(f"{address}/")
    name = world["base"].split("@")[0]
    copy_image(
        world["host"].registry, name.split("/", 1)[1], world["digest"], address, "mtp-test/base", BASE_TAG
    )
    w = copy_world(world, tmp / "manifests", f"{address}/mtp-test/base", index.url_for("simple"))
    w["env"].update(MTP_ENGINE="buildah", MTP_CA_BUNDLE=str(ca))
    locked = cli(w, "lock")  # no mirror: the origins answer
    assert locked.returncode == 0, (locked.stdout + locked.stderr)[-3000:]
    try:
        yield {**w, "registry": registry, "address": address, "index": index, "cert": ca}
    finally:
        index.stop()
        registry.__exit__(None, None, None)


def _build_and_push(w: dict, ns: str, tmp_path: Path, *args: str, **env: str) -> dict:
    summary = tmp_path / f"{ns}.json"
    registry = f"{w['host'].registry}/{ns}"
    proc = cli(
        w,
        "--profile",
        PROFILE,
        "--push",
        "--registry",
        registry,
        "--summary-file",
        str(summary),
        *args,
        **env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "buildah" in proc.stdout and "PASS   versions" in proc.stdout
    return {**json.loads(summary.read_text()), "proc": proc}


def test_through_the_mirrors_the_reproducible_image_is_bit_for_bit_the_one_without(world, origins, tmp_path):
    # with the origins, no mirror: pip fetches over https, trusting the origin's CA
    first = _build_and_push(
        origins, f"mirrors-a-{uuid.uuid4().hex[:6]}", tmp_path, "--ca-bundle", str(origins["cert"])
    )
    assert "mirrors " not in first["proc"].stdout
    # the origins go away; only the mirrors answer (and no CA bundle: none is needed now)
    origins["registry"].__exit__(None, None, None)
    origins["index"].stop()
    drop_local(origins, *first["references"], first["image"], f"mtp-verl:{PROFILE}")
    mirrors = {
        "MTP_INDEX_REWRITE": f"{origins['index'].url_for('simple')}={with_token(world['mirror'])}",
        "MTP_REGISTRY_MIRROR": f"{origins['address']}={world['mirror_registry']}",
    }
    # verify's rebuild is a clean reproducible build through the mirrors alone (the origins
    # are down), compared layer by layer and by manifest digest with the published image
    ref = f"{first['references'][0].rsplit(':', 1)[0]}@{first['digest']}"
    proc = cli(origins, "verify", "--profile", PROFILE, "--image", ref, **mirrors)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "mirrors " in proc.stderr  # the rebuild did go through them (verify says its build on stderr)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("identical: ")
    assert first["digest"] in proc.stdout, proc.stdout[-2000:]
    print(f"digest without mirrors {first['digest']}; verify's rebuild through them: identical")
    assert TOKEN not in out
