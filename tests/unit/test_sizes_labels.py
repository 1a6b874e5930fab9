"""The per-layer size table names each install layer of the rendered Dockerfile."""

from __future__ import annotations

from pathlib import Path

from mtpimage.assembly import sizes
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

REPO = Path(__file__).resolve().parents[2]


def test_every_locked_install_layer_gets_a_name():
    m = manifest.load(REPO / "manifests")
    text = render(plan_for(m, "mtp-detach", None), m.root).dockerfile
    runs = ["RUN" + block.split("\n# ")[0] for block in text.split("\nRUN")[1:]]
    labels = [
        sizes._short("/bin/bash -o pipefail -euc " + run[4:])
        for run in runs
        if "/tmp/mtp-build/requirements/" in run or "mtp_install.py record" in run
    ]
    assert "RUN install torch dependencies" in labels
    assert "RUN install sglang dependencies" in labels
    assert "RUN install sglang" in labels and "RUN install verl" in labels
    assert all(label.startswith("RUN install ") for label in labels), labels


# what buildah 1.28 writes as created_by (`--format docker`), as the reproducible engine's
# layout holds it for the test profile
BUILDAH_VENV = (
    "|2 PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=0 /bin/sh -c --mount=type=bind,source=build/lib/"
    "login-env.sh,target=/tmp/mtp-build/login-env.sh     python3.12 -m venv --system-site-packages /opt/venv"
)
BUILDAH_OS = (
    "|2 PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=0 /bin/sh -c --mount=type=cache,target=/var/cache/apt,"
    'sharing=locked     --mount=type=cache,target=/var/lib/apt/lists,sharing=locked     missing="$(for p in'
)
BUILDAH_VERL = (
    "|2 PYTHONDONTWRITEBYTECODE=1 SOURCE_DATE_EPOCH=0 /bin/sh -c --mount=type=cache,target=/root/.cache/pip "
    "--mount=type=bind,source=src/verl,target=/tmp/mtp-src/verl,rw     . /tmp/mtp-build/lib/pip-env.sh; "
    "python /tmp/mtp-build/lib/mtp_install.py record --name verl --package verl"
)


def test_buildahs_run_lines_are_named_like_dockers():
    assert sizes._short(BUILDAH_VENV) == "RUN python3.12 -m venv --system-site-packages /opt/venv"
    assert sizes._short(BUILDAH_OS).startswith('RUN missing="$(for p in')
    assert sizes._short(BUILDAH_VERL) == "RUN install verl"
    assert sizes._short("/bin/sh -c #(nop) COPY dir:abc in /opt/mtp/ ") == "COPY dir:abc in /opt/mtp/"


def test_the_reproducible_engine_gives_every_layer_a_row_with_its_tar_size(tmp_path, monkeypatch):
    """A layer of directories alone (the test profile's `os` layer: apt had nothing to do)
    has content size 0 in dockerd's history; from the layout it keeps its row."""
    import hashlib
    import io
    import json
    import tarfile

    from mtpimage.engine import buildahengine, dockerengine, ocilayout

    def tar(files: dict[str, bytes | None]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                if data is None:
                    info.type = tarfile.DIRTYPE
                    t.addfile(info)
                else:
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    layers = [
        tar({"bin/sh": b"x" * 5000}),
        tar({"var": None, "var/cache": None}),
        tar({"opt/venv/a": b"y" * 9}),
    ]
    root = tmp_path / "layout"
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for data in layers:
        (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
    diff_ids = ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers]
    history = [
        {"created_by": ""},
        {"created_by": "/bin/sh -c #(nop) ENV A=1", "empty_layer": True},
        {"created_by": BUILDAH_OS},
        {"created_by": BUILDAH_VENV},
    ]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}).encode()
    (blobs / hashlib.sha256(config).hexdigest()).write_bytes(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "config": {"digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
            "layers": [{"digest": d, "size": len(x)} for d, x in zip(diff_ids, layers)],
        }
    ).encode()
    (blobs / hashlib.sha256(manifest).hexdigest()).write_bytes(manifest)
    (root / "index.json").write_text(
        json.dumps({"manifests": [{"digest": "sha256:" + hashlib.sha256(manifest).hexdigest()}]})
    )
    layout = ocilayout.normalise(root)

    monkeypatch.setattr(dockerengine.DockerEngine, "image_id", lambda self, ref: layout.image_id)
    monkeypatch.setattr(buildahengine.BuildahEngine, "layout_of", lambda self, image_id: root)
    rows = sizes.layer_rows("mtp-verl:x", buildahengine.BuildahEngine())
    assert [(r.index, r.size, r.created_by) for r in rows] == [
        (0, len(layers[0]), "(base image)"),
        (2, len(layers[1]), 'RUN missing="$(for p in'),
        (3, len(layers[2]), "RUN python3.12 -m venv --system-site-packages /opt/venv"),
    ]
