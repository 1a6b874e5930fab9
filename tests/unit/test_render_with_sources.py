"""`render --with-sources` writes the context a build sends, also for a plan with compiled
extensions: their wheels come from the pipeline's own extension_wheels (cache, share or
builder stages), so `docker build DIR` finds build/ext-wheels/. No network here: sources and
patches are stubbed, the wheels are stand-ins."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

from mtpimage import cli
from mtpimage.assembly import buildctx, pipeline
from mtpimage.commands.load import plan_for
from mtpimage.ext import extensions
from mtpimage.manifests import manifest

PROFILE = "mtp-detach"


def test_render_with_sources_writes_the_extension_wheels_a_build_sends(tmp_path, monkeypatch, capsys):
    plan = plan_for(manifest.load(), PROFILE, None)
    built = [p.name for p in extensions.built(plan)]
    assert built, "the shipped profile compiles extensions"
    wheels = {}
    for name in built:
        path = tmp_path / f"{name.replace('-', '_')}-1.0-cp312-cp312-linux_x86_64.whl"
        path.write_bytes(f"stand-in wheel of {name}".encode())
        wheels[name] = SimpleNamespace(
            filename=path.name, path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest()
        )
    asked = []
    monkeypatch.setattr(
        pipeline,
        "extension_wheels",
        lambda plan, rendered, options, say: asked.append(plan.profile) or wheels,
    )
    monkeypatch.setattr(buildctx, "fetch_archive", lambda comp: b"")
    monkeypatch.setattr(buildctx, "source_entries", lambda comp, archive: [])
    monkeypatch.setattr(buildctx, "patch_entries", lambda rendered, progress=print: [])
    out = tmp_path / "ctx"
    assert cli.main(["render", "--profile", PROFILE, "--with-sources", "--json", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["buildable"] is True
    assert asked == [PROFILE]
    requirements = (out / extensions.CONTEXT_WHEELS / "requirements.txt").read_text()
    for name, w in wheels.items():
        assert (out / extensions.CONTEXT_WHEELS / w.filename).read_bytes() == w.path.read_bytes()
        assert f"--hash=sha256:{w.sha256}" in requirements, name
