"""A shared-registry hit does not build (issue #22): machine A compiles each extension of the
shipped plan once (a fake builder stands for BuildKit) and pushes the wheels to the session's
loopback registry (MTP_WHEEL_CACHE_REPO); machine B, with an empty wheel cache, gets every
wheel from the registry by key, byte for byte, and builds nothing."""

from __future__ import annotations

import uuid

import pytest

from mtpimage.assembly import extbuild
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.ext import extensions, wheelshare
from mtpimage.manifests import manifest
from tests.unit.test_wheel_key import FakeBuilder

pytestmark = pytest.mark.timeout(300)


def _ensure(rendered, fake, said):
    fake.calls.clear()
    return extbuild.ensure_wheels(rendered, fake.context_for, fake.request_for, said.append, jobs=2)


def test_a_registry_hit_does_not_build(registry, tmp_path, monkeypatch):
    m = manifest.load()
    rendered = render(plan_for(m, "mtp-detach", None), m.root)
    names = [p.name for p in extensions.built(rendered.plan)]
    repo = f"{registry}/t{uuid.uuid4().hex[:8]}/{wheelshare.REPOSITORY}"
    monkeypatch.setenv("MTP_WHEEL_CACHE_REPO", repo)

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "machine-a"))
    fake, said_a = FakeBuilder(tmp_path), []
    made = _ensure(rendered, fake, said_a)
    assert len(fake.calls) == len(names)
    assert sum(line.startswith("share ") for line in said_a) == len(names)

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "machine-b"))
    said_b: list[str] = []
    got = _ensure(rendered, fake, said_b)
    assert fake.calls == [] and fake.contexts.count(names[0]) == 1  # A's one context, no more
    assert not any(line.startswith("compile ") for line in said_b), said_b
    assert sum(f"from {repo}" in line for line in said_b) == len(names), said_b
    assert {n: (w.filename, w.sha256) for n, w in got.items()} == {
        n: (w.filename, w.sha256) for n, w in made.items()
    }
    for n, w in got.items():
        assert w.path.read_bytes() == made[n].path.read_bytes()
        assert str(tmp_path / "machine-b") in str(w.path)


def test_the_registry_form_of_the_share_is_accepted(registry, tmp_path, monkeypatch):
    """MTP_WHEEL_CACHE_REPO=REG/NS (as `--registry` for `wheels push`) finds the wheels that
    `wheels push --registry REG/NS` put in REG/NS/ext-wheels: machine B compiles nothing."""
    m = manifest.load()
    rendered = render(plan_for(m, "mtp-detach", None), m.root)
    names = [p.name for p in extensions.built(rendered.plan)]
    namespace = f"{registry}/n{uuid.uuid4().hex[:8]}"
    monkeypatch.delenv("MTP_WHEEL_CACHE_REPO", raising=False)
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "machine-a"))
    fake = FakeBuilder(tmp_path)
    _ensure(rendered, fake, [])
    cache_a = extbuild._cache()
    for key in cache_a.keys():
        wheelshare.push(cache_a, key, wheelshare.repository_for(namespace))

    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "machine-b"))
    monkeypatch.setenv("MTP_WHEEL_CACHE_REPO", namespace)
    said: list[str] = []
    _ensure(rendered, fake, said)
    assert fake.calls == [], said
    assert sum(f"from {namespace}/ext-wheels " in line for line in said) == len(names), said
    assert any("names a namespace" in line for line in said)
