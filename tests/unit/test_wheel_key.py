"""The compiled extensions' wheel key (issue #22): every input that changes a wheel's bytes
changes its key, as render computes it from a real plan (the shipped, locked mtp-detach);
parallel jobs do not. A cache hit does not build: ensure_wheels with a fake builder that
counts its calls. No docker, no network (the sharing registry: tests/e2e/test_wheel_key_e2e.py)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from packaging.utils import canonicalize_name

from mtpimage.assembly import extbuild
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.ext import extensions
from mtpimage.ext.wheelcache import WheelCache
from mtpimage.locations import IMAGES_DIR
from mtpimage.manifests import manifest
from tests.fixtures.wheels import make_wheel

PROFILE = "mtp-detach"


@pytest.fixture(scope="module")
def base():
    m = manifest.load()
    plan = plan_for(m, PROFILE, None)
    assert {p.name for p in extensions.built(plan)} == {"transformer-engine-torch", "apex", "flash-attn"}
    return m.root, plan


def _keys(root, plan, images=None) -> dict[str, str]:
    r = render(plan, root, images)
    assert [e["name"] for e in r.extensions] == [p.name for p in extensions.built(plan)]
    return {e["name"]: e["key"] for e in r.extensions}


def _with_build(plan, name: str, **change):
    pkgs = tuple(
        dataclasses.replace(p, build=dataclasses.replace(p.build, **change)) if p.name == name else p
        for p in plan.packages
    )
    return dataclasses.replace(plan, packages=pkgs)


def _with_rows(plan, match, edit):
    rows = tuple(edit(r) if match(r) else r for r in plan.locked)
    assert rows != plan.locked
    return dataclasses.replace(plan, locked=rows)


def _torch_row(r) -> bool:
    return r.name == "torch"


# (what changes, a function of the plan giving the changed plan, the packages whose key must move)
ALL = ("transformer-engine-torch", "apex", "flash-attn")
PLAN_CHANGES = {
    "sdist sha256": (lambda p: _with_build(p, "flash-attn", sha256="0" * 64), ("flash-attn",)),
    "sdist url": (
        lambda p: _with_build(p, "flash-attn", url="https://mirror.example/flash_attn-2.8.3.tar.gz"),
        ("flash-attn",),
    ),
    "git commit": (lambda p: _with_build(p, "apex", commit="1" * 40), ("apex",)),
    "torch version": (
        lambda p: _with_rows(p, _torch_row, lambda r: dataclasses.replace(r, version="2.11.1")),
        ALL,
    ),
    "torch file sha256": (
        lambda p: _with_rows(p, _torch_row, lambda r: dataclasses.replace(r, sha256="f" * 64)),
        ALL,
    ),
    "cuda": (lambda p: dataclasses.replace(p, cuda="13.0.1"), ALL),
    "python": (lambda p: dataclasses.replace(p, python="3.13"), ALL),
    "base digest": (
        lambda p: dataclasses.replace(p, base_digest="sha256:" + "e" * 64, base_image=p.base_image + "x"),
        ALL,
    ),
    "archs": (lambda p: dataclasses.replace(p, cuda_archs=("90", "100")), ALL),
    "a build backend's sha256": (
        lambda p: _with_rows(
            p,
            lambda r: r.layer == "build:flash-attn" and r.name == "ninja",
            lambda r: dataclasses.replace(r, sha256="d" * 64),
        ),
        ("flash-attn",),
    ),
    "a build backend's version": (
        lambda p: _with_rows(
            p,
            lambda r: r.layer == "build:apex" and r.name == "setuptools",
            lambda r: dataclasses.replace(r, version="80.10.3"),
        ),
        ("apex",),
    ),
}


@pytest.mark.parametrize("what", sorted(PLAN_CHANGES))
def test_each_plan_input_changes_exactly_the_keys_it_feeds(base, what):
    root, plan = base
    change, moved = PLAN_CHANGES[what]
    before, after = _keys(root, plan), _keys(root, change(plan))
    assert {n for n in before if before[n] != after[n]} == set(moved), what


def _env_switches(plan):
    return [(p.name, k) for p in extensions.built(plan) for k, _v in p.build.env]


def test_each_env_switch_of_each_package_changes_its_key(base):
    root, plan = base
    before = _keys(root, plan)
    switches = _env_switches(plan)
    assert len(switches) >= 8  # NVTE_*, APEX_*, FLASH_* and their archs
    for name, switch in switches:
        pkg = plan.package(name)
        env = tuple((k, v + "x" if k == switch else v) for k, v in pkg.build.env)
        after = _keys(root, _with_build(plan, name, env=env))
        assert {n for n in before if before[n] != after[n]} == {name}, (name, switch)


def _images_copy(tmp_path, rel: str, extra: str):
    images = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, images)
    with open(images / rel, "a") as f:
        f.write(extra)
    return images


@pytest.mark.parametrize(
    "rel, extra",
    [
        ("partials/ext_build.j2", "RUN true\n"),
        (f"lib/{extensions.BUILD_HELPER}", "# the helper every builder stage runs changed\n"),
    ],
)
def test_the_builder_stage_text_and_its_helper_script_are_in_the_key(base, tmp_path, rel, extra):
    root, plan = base
    before = _keys(root, plan)
    after = _keys(root, plan, _images_copy(tmp_path, rel, extra))
    assert all(before[n] != after[n] for n in before), rel


def test_a_comment_in_the_builder_stage_is_not_in_the_key(base, tmp_path):
    """Comments say why; rewording one must not recompile hours of CUDA kernels."""
    root, plan = base
    before = _keys(root, plan)
    after = _keys(root, plan, _images_copy(tmp_path, "partials/ext_build.j2", "# reworded\n  # indented\n"))
    assert before == after


def test_parallel_jobs_are_not_in_the_key_nor_in_the_dockerfile(base, monkeypatch):
    root, plan = base
    a = render(plan, root)
    b = render(dataclasses.replace(plan, ext_max_jobs=plan.ext_max_jobs + 14), root)
    assert [e["key"] for e in a.extensions] == [e["key"] for e in b.extensions]
    assert a.files == b.files and a.identity == b.identity
    # MTP_EXT_MAX_JOBS is read at build time (a --build-arg), never rendered
    monkeypatch.setenv("MTP_EXT_MAX_JOBS", "13")
    assert extbuild.max_jobs(plan.ext_max_jobs) == 13
    assert render(plan, root).files == a.files


def test_the_rendered_key_is_key_of_key_inputs(base):
    root, plan = base
    r = render(plan, root)
    recipes = {b.name: b.recipe for b in r.recipe.builders}
    for pkg, entry in zip(extensions.built(plan), r.extensions):
        inputs = extensions.key_inputs(plan, pkg, recipes[pkg.name])
        assert entry["key"] == extensions.key_of(inputs)
        # every item the key names is there, each an input the issue lists
        assert set(inputs) == {
            "schema",
            "name",
            "version",
            "source",
            "torch",
            "cuda",
            "python",
            "base",
            "archs",
            "env",
            "build_requires",
            "recipe",
        }
        assert inputs["torch"]["sha256"] and inputs["build_requires"]


# ----------------------------------------------------------------------------- hits


class FakeBuilder:
    """Stands for BuildKit: each call 'compiles' one wheel into the output folder."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.calls: list[str] = []
        self.contexts: list[str] = []

    def context_for(self, name: str) -> bytes:
        self.contexts.append(name)
        return b"context of " + name.encode()

    def request_for(self, context: bytes, target: str, out_dir, build_args, on_line=None) -> None:
        self.calls.append(target)
        assert dict(build_args)["MTP_EXT_MAX_JOBS"] == "2"
        name = canonicalize_name(target.removeprefix("mtp-ext-wheel-")).replace("-", "_")
        src = make_wheel(self.tmp / f"made-{len(self.calls)}", name=name, version="1.0")
        shutil.copy(src, out_dir / src.name)


def test_a_cache_hit_does_not_build_a_miss_builds_once(base, tmp_path, monkeypatch):
    root, plan = base
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTP_WHEEL_CACHE_REPO", raising=False)
    rendered = render(plan, root)
    fake, said = FakeBuilder(tmp_path), []
    names = [p.name for p in extensions.built(plan)]

    def run():
        fake.calls.clear()
        said.clear()
        return extbuild.ensure_wheels(rendered, fake.context_for, fake.request_for, said.append, jobs=2)

    first = run()
    assert sorted(fake.calls) == sorted(extensions.wheel_stage(n) for n in names)  # one per key
    assert sum(line.startswith("compile ") for line in said) == len(names)
    second = run()
    assert fake.calls == [] and not any(line.startswith("compile ") for line in said)
    assert all("(cached, key " in line for line in said if not line.startswith("note: ")), said
    # nothing pinned in the shipped manifests: each wheel is said to be unpinned, with the fix
    assert sum(
        line.startswith("note: ") and "is not pinned in wheels.lock.yaml" in line for line in said
    ) == len(names)
    assert {n: w.sha256 for n, w in second.items()} == {n: w.sha256 for n, w in first.items()}

    # one entry gone: exactly that one builds again, under the same key
    cache = WheelCache()
    gone = next(e for e in rendered.extensions if e["name"] == "flash-attn")["key"]
    assert cache.remove(gone)
    run()
    assert fake.calls == [extensions.wheel_stage("flash-attn")]
    assert cache.get(gone) is not None
    assert cache.get(gone).meta["inputs"]["name"] == "flash-attn"
    run()
    assert fake.calls == []


def test_only_the_packages_asked_for_are_built(base, tmp_path, monkeypatch):
    # `wheels build --package apex`: the other extensions are neither built nor looked up
    root, plan = base
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MTP_WHEEL_CACHE_REPO", raising=False)
    rendered = render(plan, root)
    fake, said = FakeBuilder(tmp_path), []
    got = extbuild.ensure_wheels(
        rendered, fake.context_for, fake.request_for, said.append, jobs=2, only=frozenset({"apex"})
    )
    assert list(got) == ["apex"] and fake.calls == [extensions.wheel_stage("apex")]
    assert not any("flash-attn" in line or "transformer-engine" in line for line in said), said
