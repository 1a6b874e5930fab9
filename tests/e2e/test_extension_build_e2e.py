"""End to end, issue #22: a compiled extension built by the tool in a builder stage, for real
(dockerd, BuildKit, the loopback registry), small enough for CI: `mtp_tiny_add`, one C++ file
written here (tests/fixtures/tiny_ext.py), served as an sdist from a loopback HTTP server and
pinned by sha256 in a `build:` block of the test catalogue. Nothing here needs a GPU or nvcc.

  1. the first build compiles it in its builder stage (a miss), files the wheel in the wheel
     cache (a private MTP_CACHE_DIR) and installs it by sha256 in the extensions layer; the
     module imports and adds in a container; the records (/opt/mtp/installed, pip inspect's
     direct_url, the version vector, the image label) name the sdist URL, its sha256, the key
     and the wheel's sha256; the image holds no compiler and no build tree;
  2. another profile (another identity, the same key) takes the wheel from the cache and runs
     no builder stage (BuildKit's cache is never pruned here: a shared machine);
  3. the sdist changes under the same URL: a machine without the cached sdist refuses it, one
     line naming the package, the URL, both sha256 and the fix, and tags nothing.
While another build on the same dockerd compiles an extension, this one's builder stage and
its layers wait for it: both mount the ccache and pip caches with sharing=locked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from mtpimage.ext.wheelcache import WheelCache
from tests.fixtures import tiny_ext
from tests.fixtures.image_fixtures import image_world, world_cli
from tests.fixtures.servers import HttpFileServer

pytestmark = pytest.mark.timeout(1800)
FIRST, SECOND = "test-detach", "test-load-only"
NAME, MODULE = tiny_ext.NAME, tiny_ext.MODULE
LABEL = f"io.mtp-image-builder.extension.{NAME}"


@pytest.fixture(scope="module")
def world(docker_host, git_world, tmp_path_factory):
    w = image_world(docker_host, git_world, tmp_path_factory, "ext-build")
    with HttpFileServer(tmp_path_factory.mktemp("sdists")) as http:
        sdist = tiny_ext.write_sdist(http.root)
        url = http.url_for(sdist.name)
        sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
        m = Path(w["manifests"])
        cat_path = m / "components.yaml"
        cat = yaml.safe_load(cat_path.read_text())
        cat["layers"] = ["extensions", *cat["layers"]]
        # nothing to build against (no torch here): the builders start after the python layer;
        # the compiler and Python's headers live in the builder stage only
        cat["builds"] = {
            "against": "torch",
            "cuda_archs": ["90"],
            "os_packages": ["ccache", "g++", "python3-dev", "python3-wheel"],
        }
        cat["packages"] = {
            NAME: {
                "version": tiny_ext.VERSION,
                "layer": "extensions",
                "requires_dist": {
                    "requires": [],
                    "source": "tests/fixtures/tiny_ext.py: no install_requires",
                },
                "build": {
                    "sdist": {"url": url, "sha256": sha},
                    "env": {"MTP_TINY_ARCHS": "{cuda_archs}"},
                    "produces": [MODULE],
                },
            }
        }
        cat_path.write_text(yaml.safe_dump(cat, sort_keys=False))
        base = m / "profiles" / "base.yaml"
        prof = yaml.safe_load(base.read_text())
        prof["stack"]["packages"] = [NAME]
        base.write_text(yaml.safe_dump(prof, sort_keys=False))
        yield {**w, "http": http, "sdist": sdist, "url": url, "sha": sha}


def _rendered(world, profile) -> tuple[str, dict]:
    out = Path(world["manifests"]).parent / f"render-{profile}"
    proc = world_cli(world, "render", "--profile", profile, "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    vector = json.loads((out / "mtp" / "version.json").read_text())
    [entry] = vector["extensions"]
    return json.loads(proc.stdout)["identity"], entry


def _in_image(world, image, *argv):
    return world["host"].docker("run", "--rm", image, *argv, check=False, timeout=300)


def _cache(world) -> WheelCache:
    return WheelCache(Path(world["env"]["MTP_CACHE_DIR"]) / "ext-wheels")


@pytest.fixture(scope="module")
def first(world):
    identity, entry = _rendered(world, FIRST)
    assert _cache(world).keys() == []  # a private cache: this build is a miss
    proc = world_cli(world, "--profile", FIRST)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {"proc": proc, "identity": identity, "entry": entry, "image": f"mtp-verl:{identity}"}


def test_the_first_build_compiles_it_once_and_caches_the_wheel(world, first):
    out, log = first["proc"].stdout, first["proc"].stderr
    key = first["entry"]["key"]
    assert re.search(rf"^compile {NAME} +{tiny_ext.VERSION} from {tiny_ext.SDIST} \(sha256 ", out, re.M), out
    assert re.search(
        rf"^wheel   {NAME} +\S+\.whl sha256 [0-9a-f]{{12}} built in \d+s \(key {key[:12]}\)", out, re.M
    )
    assert "mtp_extension: building mtp-tiny-add" in out  # the builder stage really ran (#38 item 3:
    # its own lines are said, the compiler's output goes only to the log whose path is printed)
    [log_line] = [ln for ln in out.splitlines() if ln.startswith("log     ")]
    compile_log = Path(log_line.split()[1]).read_text()
    assert "mtp_extension: building mtp-tiny-add" in compile_log and "mtp_extension: building" not in log
    assert re.search(
        rf"^compile(d)? +{NAME} ", out[out.index(log_line) :], re.M
    )  # the progress's closing line
    assert _cache(world).keys() == [key]
    wheel = _cache(world).get(key)
    assert wheel.filename.startswith(f"{MODULE}-{tiny_ext.VERSION}-") and wheel.filename.endswith(".whl")
    assert wheel.meta["inputs"]["source"] == {"kind": "sdist", "url": world["url"], "sha256": world["sha"]}
    assert first["entry"] == {
        "name": NAME,
        "version": tiny_ext.VERSION,
        "source": {"kind": "sdist", "url": world["url"], "sha256": world["sha"]},
        "archs": ["90"],
        "env": ["MTP_TINY_ARCHS=90"],
        "key": key,
    }


def test_the_image_imports_and_calls_the_compiled_module(world, first):
    proc = _in_image(
        world,
        first["image"],
        "python",
        "-c",
        f"import {MODULE} as m; print(m.add(2, 40), m.archs(), m.__file__)",
    )
    assert proc.returncode == 0, proc.stderr
    total, archs, where = proc.stdout.split()
    assert (total, archs) == ("42", "90")  # the build switch reached the compiler
    assert where.startswith("/opt/venv/") and where.endswith(".so")
    # the wheel, not the build: no compiler, no build tree, no source in the image
    bare = _in_image(
        world,
        first["image"],
        "sh",
        "-c",
        "command -v g++ || ls -d /tmp/mtp-ext-build /tmp/mtp-ext-src || echo none",
    )
    assert bare.stdout.strip().splitlines()[-1] == "none", bare.stdout


def test_the_image_records_the_sdist_the_key_and_the_wheels_sha256(world, first):
    wheel = _cache(world).get(first["entry"]["key"])
    rec = json.loads(_in_image(world, first["image"], "cat", f"/opt/mtp/installed/{NAME}.json").stdout)
    assert rec["built_from"] == {"kind": "sdist", "url": world["url"], "sha256": world["sha"]}
    assert (rec["wheel"], rec["wheel_sha256"], rec["key"]) == (wheel.filename, wheel.sha256, wheel.key)
    assert rec["version"] == tiny_ext.VERSION
    inspect = json.loads(_in_image(world, first["image"], "pip", "inspect").stdout)
    [dist] = [d for d in inspect["installed"] if d["metadata"]["name"] == NAME]
    assert dist["direct_url"] == {"url": world["url"], "archive_info": {"hashes": {"sha256": world["sha"]}}}
    vector = json.loads(_in_image(world, first["image"], "cat", "/opt/mtp/version.json").stdout)
    assert vector["extensions"] == [first["entry"]]
    labels = json.loads(
        world["host"].docker("image", "inspect", "--format", "{{json .Config.Labels}}", first["image"]).stdout
    )
    assert labels[LABEL] == f"{wheel.filename} sha256:{wheel.sha256}"


def test_another_identity_with_the_same_key_takes_the_cached_wheel_and_builds_no_builder(world, first):
    identity, entry = _rendered(world, SECOND)
    assert identity != first["identity"] and entry["key"] == first["entry"]["key"]
    proc = world_cli(world, "--profile", SECOND)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    key = entry["key"]
    assert re.search(
        rf"^wheel   {NAME} +\S+\.whl sha256 [0-9a-f]{{12}} \(cached, key {key[:12]}\)$", proc.stdout, re.M
    )
    assert not re.search(r"^compile ", proc.stdout, re.M)
    assert "mtp_extension: building" not in proc.stdout + proc.stderr  # no builder stage ran
    assert re.search(r"^built ", proc.stdout, re.M)  # the image itself was built
    wheel = _cache(world).get(key)
    labels = json.loads(
        world["host"]
        .docker("image", "inspect", "--format", "{{json .Config.Labels}}", f"mtp-verl:{identity}")
        .stdout
    )
    assert labels[LABEL] == f"{wheel.filename} sha256:{wheel.sha256}"


def test_an_sdist_that_changed_under_the_same_url_is_refused(world, first, tmp_path):
    # another machine: no cached wheel, no cached sdist; the server now serves other bytes
    identity = _rendered(world, "test-cp-recompute")[0]
    swapped = tiny_ext.sdist_bytes(variant="rebuilt and re-uploaded under the same name")
    world["sdist"].write_bytes(swapped)
    try:
        env = {**world["env"], "MTP_CACHE_DIR": str(tmp_path / "other-machine")}
        proc = world_cli({**world, "env": env}, "--profile", "test-cp-recompute")
    finally:
        world["sdist"].write_bytes(tiny_ext.sdist_bytes())
    got = hashlib.sha256(swapped).hexdigest()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {NAME}: {tiny_ext.SDIST} from {world['url']} has sha256 {got}, components.yaml pins "
        f"{world['sha']} (fix: the file changed under the same URL; find out why before pinning the new hash)"
    ], proc.stderr[-2000:]
    # refused when its bytes arrived, before any builder stage: no wheel, no image, no tag
    assert not re.search(r"^(wheel|build|built|tagged) ", proc.stdout, re.M)
    assert world["host"].docker("image", "inspect", f"mtp-verl:{identity}", check=False).returncode != 0
    assert WheelCache(tmp_path / "other-machine" / "ext-wheels").keys() == []


def test_without_a_mirror_the_build_fails_before_anything_compiles(world, tmp_path):
    """#38 item 2: a machine with no route to github.com and no url.insteadOf mirror, an empty
    wheel cache (the extension would compile first): the build stops in one line with the
    mirror fix before any compile, image or tag."""
    identity = _rendered(world, "test-cp-recompute")[0]
    env = {**world["env"], "MTP_CACHE_DIR": str(tmp_path / "fresh"), "GIT_CONFIG_GLOBAL": os.devnull}
    proc = world_cli({**world, "env": env}, "--profile", "test-cp-recompute")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: cannot fetch megatron-lm: "), proc.stderr[-2000:]
    assert "insteadOf" in errors[0]
    assert not re.search(r"^(compile|wheel|build|built|tagged) ", proc.stdout, re.M), proc.stdout
    assert "mtp_extension: building" not in proc.stdout + proc.stderr
    assert world["host"].docker("image", "inspect", f"mtp-verl:{identity}", check=False).returncode != 0


def test_pin_then_verify_rebuilds_the_same_wheel_and_a_rewritten_entry_is_refused(world, first):
    """Issue #35: `wheels pin` records the compiled wheel's sha256 in the manifests; `wheels
    verify` compiles it again (no cache) to the same bytes; an entry whose wheel and meta.json
    were both rewritten is named by `verify` and refused by the next build (exit 3)."""
    key = first["entry"]["key"]
    proc = world_cli(world, "wheels", "pin", "--profile", FIRST)
    assert proc.returncode == 0 and f"pinned        {key[:12]}" in proc.stdout, proc.stdout + proc.stderr
    proc = world_cli(world, "wheels", "verify", key[:12], "--profile", FIRST)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        "mtp_extension: building mtp-tiny-add" in proc.stdout
    )  # it really compiled again (said by the progress)
    wheel = _cache(world).get(key)
    assert f"rebuilt  {NAME} key {key[:12]}: sha256 {wheel.sha256}" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("identical: ")

    entry_dir = wheel.path.parent
    saved = {p.name: p.read_bytes() for p in entry_dir.iterdir()}
    try:
        other = tiny_ext.write_sdist(Path(world["manifests"]).parent / "evil")  # any other bytes
        wheel.path.write_bytes(other.read_bytes())
        meta = json.loads((entry_dir / "meta.json").read_text())
        meta.update(sha256=hashlib.sha256(other.read_bytes()).hexdigest(), size=other.stat().st_size)
        (entry_dir / "meta.json").write_text(json.dumps(meta))
        proc = world_cli(world, "wheels", "verify", key[:12], "--profile", FIRST)
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert (
            len(errors) == 1 and f"wheel cache entry {key[:12]}" in errors[0] and meta["sha256"] in errors[0]
        )
        # SECOND's image exists when an earlier test built it ("up to date", nothing taken from
        # the cache): drop it, so this build must install the cache's wheel
        world["host"].docker(
            "image", "rm", "--no-prune", f"mtp-verl:{_rendered(world, SECOND)[0]}", check=False
        )
        proc = world_cli(world, "--profile", SECOND)
        assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"wheels.lock.yaml pins {wheel.sha256}" in errors[0], proc.stderr[-2000:]
        assert not re.search(r"^(built|tagged) ", proc.stdout, re.M)
    finally:
        for name, data in saved.items():
            (entry_dir / name).write_bytes(data)
        (Path(world["manifests"]) / "wheels.lock.yaml").unlink(missing_ok=True)


# ------------------------------------------------------------------------ issue 49: the GPU's arch
# nvidia-smi as the container toolkit mounts it: the driver check's two queries
STUB_SMI = """#!/bin/sh
case "$*" in
"--query-gpu=compute_cap --format=csv,noheader") echo "${STUB_CAP:?}" ;;
*) echo "580.159.04, ${STUB_GPU:?}" ;;
esac
"""


def _gpu_node(world, image: str, tmp_path: Path) -> str:
    """The built image with a stub nvidia-smi added: its ENTRYPOINT and driver.facts are the
    built ones."""
    host = world["host"]
    (tmp_path / "nvidia-smi").write_text(STUB_SMI)
    (tmp_path / "Dockerfile").write_text(
        f"FROM {image}\nCOPY --chmod=755 nvidia-smi /usr/local/bin/nvidia-smi\n"
    )
    tag = f"{host.registry}/mtp-e2e/gpu-node:{image.rsplit(':', 1)[-1]}"
    built = host.build(tmp_path, tag)
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return tag


def _on(world, node: str, gpu: str, cap: str):
    return world["host"].docker(
        "run", "--rm", "-e", f"STUB_GPU={gpu}", "-e", f"STUB_CAP={cap}", node, "sh", "-c", "echo command ran",
        check=False, timeout=120,
    )  # fmt: skip


def test_the_entrypoint_refuses_a_b200_under_an_sm_90_image_and_runs_on_an_h200(world, first, tmp_path):
    node = _gpu_node(world, first["image"], tmp_path)
    try:
        facts = _in_image(world, first["image"], "cat", "/opt/mtp/runtime/driver.facts").stdout
        assert "cuda_archs=90\n" in facts and f"profile={FIRST}\n" in facts
        refused = _on(world, node, "NVIDIA B200", "10.0")
        assert refused.returncode == 1 and "command ran" not in refused.stdout, (
            refused.stdout + refused.stderr
        )
        [line] = refused.stderr.strip().splitlines()
        assert line == (
            "mtp driver check: GPU 0 (NVIDIA B200) has compute capability 10.0: this image's compiled "
            "extensions carry code for sm_90 only, and none of it runs on an sm_100 GPU (fix: use an image "
            f'built with builds.cuda_archs including "100" (python3 build.py --profile {FIRST} --set '
            "builds.cuda_archs=90,100), or run this one on GPUs of sm_90)"
        )
        ran = _on(world, node, "NVIDIA H200", "9.0")
        assert ran.returncode == 0 and ran.stdout.strip() == "command ran", ran.stderr
        assert ran.stderr.strip().endswith("(compute capability 9.0) has code among the image's sm_90")
    finally:
        world["host"].docker("image", "rm", node, check=False)


def test_an_image_built_for_sm_90_and_sm_100_runs_on_a_b200(world, first, tmp_path):
    proc = world_cli(world, "--profile", FIRST, "--set", "builds.cuda_archs=90,100")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [image] = re.findall(r"(mtp-verl:test-detach-[0-9a-f]{12})", proc.stdout)[:1]
    try:
        assert image != first["image"]  # another identity, and another wheel (its key has the archs)
        assert re.search(rf"^compile {NAME} ", proc.stdout, re.M)
        archs = _in_image(world, image, "python", "-c", f"import {MODULE} as m; print(m.archs())")
        assert archs.stdout.strip() == "90;100"  # both reached the compiler
        node = _gpu_node(world, image, tmp_path)
        ran = _on(world, node, "NVIDIA B200", "10.0")
        world["host"].docker("image", "rm", node, check=False)
        assert ran.returncode == 0 and ran.stdout.strip() == "command ran", ran.stderr
        [line] = ran.stderr.strip().splitlines()
        assert line.endswith(
            "every GPU here (compute capability 10.0) has code among the image's sm_90, sm_100"
        )
    finally:  # the profile's tag back on the module's image, this one gone
        world["host"].docker("tag", first["image"], f"mtp-verl:{FIRST}", check=False)
        world["host"].docker("image", "rm", image, check=False)
