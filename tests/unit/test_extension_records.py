"""What the image records of each compiled extension (issue #22): the rendered version vector
(mtp/version.json) lists name, version, source pin, archs, env and the wheel key, and that key
is the one the wheel cache files the wheel under; the build adds the wheel's file and sha256
(build/ext-wheels/extensions.json for /opt/mtp/installed/<name>.json, and an image label).
The built image carries them: tests/e2e/test_extension_build_e2e.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from mtpimage.assembly import extbuild, pipeline
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.ext import extensions
from mtpimage.manifests import manifest

PROFILE = "mtp-detach"


def _rendered():
    m = manifest.load()
    return render(plan_for(m, PROFILE, None), m.root)


def test_the_version_vector_lists_each_extension_with_its_pin_and_key():
    r = _rendered()
    plan = r.plan
    vector = json.loads(r.files["mtp/version.json"])
    recipes = {b.name: b.recipe for b in r.recipe.builders}
    by_name = {e["name"]: e for e in vector["extensions"]}
    assert list(by_name) == ["transformer-engine-torch", "apex", "flash-attn"]
    for pkg in extensions.built(plan):
        e = by_name[pkg.name]
        assert set(e) == {"name", "version", "source", "archs", "env", "key"}
        assert e["version"] == pkg.version
        b = pkg.build
        if b.source == "sdist":
            assert e["source"] == {"kind": "sdist", "url": b.url, "sha256": b.sha256}
        else:
            assert e["source"] == {"kind": "git", "repo": b.repo, "ref": b.ref, "commit": b.commit}
        assert e["archs"] == list(plan.cuda_archs) == ["90"]
        # the switches with the architectures filled in, as the builder stage gets them
        assert sorted(k for k, _ in b.env) == [x.split("=")[0] for x in e["env"]]
        assert not any("{" in x for x in e["env"])
        assert f"--env {e['env'][0]}" in recipes[pkg.name]
        assert e["key"] == extensions.key_of(extensions.key_inputs(plan, pkg, recipes[pkg.name]))
    assert by_name["flash-attn"]["env"] == ["FLASH_ATTENTION_FORCE_BUILD=TRUE", "FLASH_ATTN_CUDA_ARCHS=90"]
    assert by_name["apex"]["env"][-1] == "TORCH_CUDA_ARCH_LIST=9.0"
    assert len({e["key"] for e in by_name.values()}) == 3


def _wheels(tmp_path: Path, r) -> dict:
    out = {}
    for pkg in extensions.built(r.plan):
        path = tmp_path / f"{pkg.name.replace('-', '_')}-{pkg.version}-cp312-cp312-linux_x86_64.whl"
        path.write_bytes(f"wheel of {pkg.name}".encode())
        out[pkg.name] = SimpleNamespace(
            filename=path.name, path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest()
        )
    return out


def test_the_build_adds_each_wheel_file_and_sha256_to_the_records_and_labels(tmp_path):
    r = _rendered()
    wheels = _wheels(tmp_path, r)
    files = {path: data for path, data, _mode in extbuild.wheel_entries(r, wheels)}
    listing = json.loads(files[f"{extensions.CONTEXT_WHEELS}/extensions.json"])["extensions"]
    vector = json.loads(r.files["mtp/version.json"])["extensions"]
    for entry, recorded in zip(listing, vector):
        w = wheels[entry["name"]]
        # the vector's record plus the wheel: what mtp_extension.py record writes in the image
        assert entry == {**recorded, "wheel": w.filename, "sha256": w.sha256}
    req = files[f"{extensions.CONTEXT_WHEELS}/requirements.txt"].decode().splitlines()
    assert req == [
        f"{n} @ file:///tmp/mtp-ext-wheels/{w.filename} --hash=sha256:{w.sha256}" for n, w in wheels.items()
    ]
    labels = pipeline.extension_labels(wheels)
    assert labels == {
        f"io.mtp-image-builder.extension.{n}": f"{w.filename} sha256:{w.sha256}" for n, w in wheels.items()
    }
