"""`wheels add` (issue #22): a site's prebuilt wheel enters the wheel cache by sha256 under the
key the profile's build looks up, so that build installs it and compiles nothing for it; every
check that fails is one line and exit 2, and nothing enters the cache. The shipped plan, a
stand-in wheel written here (a fake compiled module), a private MTP_CACHE_DIR."""

from __future__ import annotations

import hashlib
import json

import pytest

from mtpimage.build.render import render
from mtpimage.ext import extbuild, extensions
from mtpimage.ext.wheelcache import WheelCache
from mtpimage.manifests import manifest
from mtpimage.plan.load import plan_for
from tests.fixtures.wheels import make_wheel

from .helpers import assert_one_line_error, run_cli
from .test_wheel_key import FakeBuilder

PROFILE = "mtp-detach"
SO = "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"
TAG = "cp312-cp312-linux_x86_64"


def _wheel(tmp_path, sub="w", name="flash_attn", version="2.8.3", tag=TAG, so=SO, **kw):
    extra = {so: b"\x7fELF stand-in"} if so else {}
    return make_wheel(tmp_path / sub, name=name, version=version, tag=tag, extra=extra, **kw)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _key(name: str) -> str:
    m = manifest.load()
    r = render(plan_for(m, PROFILE, None), m.root)
    return next(e["key"] for e in r.extensions if e["name"] == name)


@pytest.fixture
def env(tmp_path):
    return {"MTP_CACHE_DIR": str(tmp_path / "cache"), "MTP_WHEEL_CACHE_REPO": ""}


def _add(env, wheel, sha, package="flash-attn", *more):
    return run_cli(
        "wheels",
        "add",
        "--profile",
        PROFILE,
        "--package",
        package,
        "--sha256",
        sha,
        *more,
        str(wheel),
        env=env,
    )


def test_a_site_wheel_is_filed_under_the_plans_key_and_the_build_uses_it(tmp_path, env, monkeypatch):
    wheel = _wheel(tmp_path)
    proc = _add(env, wheel, _sha(wheel))
    assert proc.returncode == 0, proc.stderr
    key = _key("flash-attn")
    assert proc.stdout.startswith(f"added {key[:12]}  {wheel.name}  sha256 {_sha(wheel)[:12]}")
    entry = WheelCache(tmp_path / "cache" / "ext-wheels").get(key)
    assert entry.sha256 == _sha(wheel) and entry.filename == wheel.name
    assert entry.meta["provided_by"] == "site" and entry.meta["original_filename"] == wheel.name
    assert extensions.key_of(entry.meta["inputs"]) == key  # its inputs are the plan's
    listed = run_cli("wheels", "list", "--json", env=env)
    [row] = json.loads(listed.stdout)["wheels"]
    assert row["built_by"] == f"site ({wheel.name})" and row["name"] == "flash-attn"

    again = _add(env, wheel, _sha(wheel))
    assert again.returncode == 0 and again.stdout.startswith(f"already there {key[:12]}")

    # the build: flash-attn from the cache, only the other two compile
    monkeypatch.setenv("MTP_CACHE_DIR", env["MTP_CACHE_DIR"])
    monkeypatch.delenv("MTP_WHEEL_CACHE_REPO", raising=False)
    m = manifest.load()
    rendered = render(plan_for(m, PROFILE, None), m.root)
    fake, said = FakeBuilder(tmp_path), []
    got = extbuild.ensure_wheels(rendered, fake.context_for, fake.request_for, said.append, jobs=2)
    assert extensions.wheel_stage("flash-attn") not in fake.calls and len(fake.calls) == 2
    assert got["flash-attn"].sha256 == _sha(wheel)
    assert any(line.startswith("wheel   flash-attn") and "(cached, key" in line for line in said)
    assert not any(line.startswith("compile flash-attn") for line in said)


@pytest.mark.parametrize(
    "case, make, needles",
    [
        ("sha256", lambda t: (_wheel(t), "0" * 64), ["has sha256", "--sha256 says " + "0" * 64]),
        (
            "version",
            lambda t: (_wheel(t, version="2.8.2"), None),
            ["is flash-attn 2.8.2", "builds flash-attn 2.8.3"],
        ),
        ("name", lambda t: (_wheel(t, name="flash_attn_x"), None), ["is flash-attn-x 2.8.3"]),
        (
            "produces",
            lambda t: (_wheel(t, so="other.cpython-312-x86_64-linux-gnu.so"), None),
            ["flash_attn_2_cuda"],
        ),
        ("python", lambda t: (_wheel(t, tag="cp311-cp311-linux_x86_64"), None), ["cp311", "Python 3.12"]),
        (
            "metadata",
            lambda t: (_wheel(t, meta_name="flash_attn_fork"), None),
            ["METADATA says flash_attn_fork"],
        ),
    ],
)
def test_a_wheel_that_is_not_the_plans_is_refused_in_one_line(tmp_path, env, case, make, needles):
    wheel, sha = make(tmp_path)
    proc = _add(env, wheel, sha or _sha(wheel))
    assert_one_line_error(proc, str(wheel), "(fix: ", *needles)
    assert (
        not (tmp_path / "cache" / "ext-wheels").exists()
        or not WheelCache(tmp_path / "cache" / "ext-wheels").keys()
    )


def test_a_package_the_profile_does_not_compile_is_refused(tmp_path, env):
    wheel = _wheel(tmp_path, name="torch", version="2.11.0", so=None)
    proc = _add(env, wheel, _sha(wheel), "torch")
    assert_one_line_error(proc, "--package: torch", "does not compile torch", "flash-attn")


def test_a_key_that_holds_other_bytes_is_not_replaced(tmp_path, env):
    first = _wheel(tmp_path, "a", payload="A = 1\n")
    assert _add(env, first, _sha(first)).returncode == 0
    other = _wheel(tmp_path, "b", payload="B = 2\n")
    proc = _add(env, other, _sha(other))
    assert_one_line_error(proc, "already holds", _sha(first), "wheels remove")
    assert WheelCache(tmp_path / "cache" / "ext-wheels").get(_key("flash-attn")).sha256 == _sha(first)
