"""Substitutions: a local build that cannot reach the real base or verl's wheelhouse says so in
the plan digest, the version vector and a label; a substituted image never passes for the real
one, and --frozen still holds because the manifests and the lock are unchanged."""

from __future__ import annotations

import json

import pytest

from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.errors import InputError
from mtpimage.lock import lockfile
from mtpimage.manifests import manifest

BASE = "127.0.0.1:5000/mtp-standin/cuda:13.0.2-devel@sha256:" + "a" * 64
OMIT = "transformer-engine,flash-attn,apex"


def _plan(monkeypatch, base="", omit=""):
    monkeypatch.setenv("MTP_SUBSTITUTE_BASE", base)
    monkeypatch.setenv("MTP_OMIT_PACKAGES", omit)
    m = manifest.load()
    return m, plan_for(m, "mtp-detach", None)


def test_substitutions_change_the_identity_and_are_recorded(monkeypatch):
    m, real = _plan(monkeypatch)
    _, sub = _plan(monkeypatch, BASE, OMIT)
    assert real.substitutions == () and len(sub.substitutions) == 4
    assert sub.digest != real.digest and sub.base_image == BASE
    assert {p.name for p in sub.packages} == {p.name for p in real.packages} - set(OMIT.split(","))
    assert not {r.name for r in sub.locked} & set(OMIT.split(","))
    assert {r.name for r in real.locked} - {r.name for r in sub.locked} == set(OMIT.split(","))
    rendered = render(sub, m.root)
    vector = json.loads(rendered.files["mtp/version.json"])
    assert [s["what"] for s in vector["substitutions"]] == ["base_image", "omitted", "omitted", "omitted"]
    assert "io.mtp-image-builder.substitutions" in rendered.dockerfile
    assert f"FROM {BASE}" in rendered.dockerfile
    lockfile.check_frozen(m, sub)  # a declared substitution is not drift


def test_a_substitute_base_must_be_pinned_and_omitted_packages_must_exist(monkeypatch):
    with pytest.raises(InputError, match="sha256"):
        _plan(monkeypatch, "127.0.0.1:5000/x:latest")
    with pytest.raises(InputError, match="not a package"):
        _plan(monkeypatch, "", "no-such-package")
