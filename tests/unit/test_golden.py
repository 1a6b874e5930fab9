"""Golden renders: the rendered Dockerfile and version vector of every test profile
(tests/manifests/) and every shipped profile (manifests/) are committed under tests/golden/,
so a change to a template, a partial, the plan or the vector is reviewed as a diff of these
files, as hpccm's tests do. When a render changes on purpose, regenerate them with

    .venv/bin/python -m pytest tests/unit/test_golden.py --update-golden

and commit the diff with the change. Substitutions are cleared: goldens are the profiles as
declared (with the shipped lock.yaml for manifests/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
SETS = {"test": REPO / "tests" / "manifests", "shipped": REPO / "manifests"}
# what is kept of each render: golden file name -> path in the rendered context
KEPT = {"Dockerfile": "Dockerfile", "version.json": "mtp/version.json"}


def _cases() -> list[tuple[str, str]]:
    return [(s, name) for s, root in SETS.items() for name in manifest.load(root).names()]


@pytest.fixture(autouse=True)
def _declared(monkeypatch):
    for var in ("MTP_SUBSTITUTE_BASE", "MTP_OMIT_PACKAGES"):
        monkeypatch.delenv(var, raising=False)


def _render(set_name: str, profile: str) -> dict[str, bytes]:
    root = SETS[set_name]
    rendered = render(plan_for(manifest.load(root), profile, None), root)
    return {golden: rendered.files[path] for golden, path in KEPT.items()}


@pytest.mark.parametrize("set_name,profile", _cases(), ids=lambda v: v)
def test_render_matches_its_golden_files(set_name, profile, request):
    where = GOLDEN / set_name / profile
    got = _render(set_name, profile)
    if request.config.getoption("--update-golden"):
        where.mkdir(parents=True, exist_ok=True)
        for name, data in got.items():
            (where / name).write_bytes(data)
        return
    for name, data in got.items():
        path = where / name
        assert path.is_file(), f"{path.relative_to(REPO)} missing: run pytest {__file__} --update-golden"
        assert path.read_bytes() == data, (
            f"the render of {set_name}/{profile} changed: {path.relative_to(REPO)} differs (if on "
            "purpose: pytest tests/unit/test_golden.py --update-golden, and commit the diff)"
        )


def test_no_golden_without_a_profile():
    """A removed profile takes its golden files with it."""
    cases = {f"{s}/{n}" for s, n in _cases()}
    present = {p.parent.relative_to(GOLDEN).as_posix() for p in GOLDEN.rglob("Dockerfile")}
    assert present <= cases, sorted(present - cases)


def test_a_changed_render_fails(tmp_path, monkeypatch):
    """The check bites: a template edit that the golden files do not carry is a failure."""
    import shutil

    from mtpimage import locations

    images = tmp_path / "images"
    shutil.copytree(locations.IMAGES_DIR, images)
    template = images / "Dockerfile.j2"
    template.write_text(template.read_text() + "# an unreviewed change\n")
    root = SETS["test"]
    name = manifest.load(root).names()[0]
    changed = render(plan_for(manifest.load(root), name, None), root, images=images).files["Dockerfile"]
    assert changed != (GOLDEN / "test" / name / "Dockerfile").read_bytes()
