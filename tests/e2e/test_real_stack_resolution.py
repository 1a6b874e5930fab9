"""The REAL shipped stack resolves, in CI: PyPI's real metadata for every package (no wheel
downloads: uv reads METADATA only), the git sources as lock.yaml recorded what stood in for
them (their own Requires-Dist read from the pinned commits, so no GitHub is needed), and the
manifests' overrides/excludes, at the resolution cutoff lock.yaml records (uv's exclude-newer:
what PyPI publishes after it is not a candidate), keeping lock.yaml's pins where they still fit
as a plain `lock` does. Fails on any conflict no declared override covers, and on any drift
between what resolves at that cutoff and what lock.yaml says the image installs. Why the pins
are kept: the index here lists files later than their upload times say (filelock 4.3.2,
lxml 6.2.0 and python-discovery 1.9.7 appeared dated before the cutoff after the lock was made),
so a cutoff alone is not a fixed point."""

from __future__ import annotations

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from mtpimage.cli import plan_for
from mtpimage.lock import lockfile, resolver
from mtpimage.manifests import manifest

PROFILE = "mtp-cp-recompute"


def _lock(platform: str = "linux/amd64"):
    m = manifest.load()
    doc = yaml.safe_load((m.root / "lock.yaml").read_text())
    return m, doc, doc["python_sets"][lockfile.set_key_for(doc, PROFILE, platform)]


def _cutoff(doc) -> dict:
    cutoff = lockfile.cutoff_of(doc)
    assert cutoff, "lock.yaml must record its resolution cutoff"
    return cutoff


@pytest.mark.parametrize(("platform", "arch"), [("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")])
def test_the_real_shipped_stack_resolves_to_exactly_the_lock(tmp_path, monkeypatch, platform, arch):
    """Per platform of the lock (issue 49): the arm64 set is its own resolution for aarch64."""
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))  # cold: ask PyPI
    m, doc, pyset = _lock(platform)
    plan = plan_for(m, PROFILE, [f"builds.platform={platform}"])
    assert plan.locked, "lock.yaml must match the shipped manifests"
    res = resolver.resolve(
        pyset["requirements"],
        pyset["stubs"],
        [o[0] for o in plan.resolution_overrides],
        [e[0] for e in plan.excludes],
        [dict(plan.indexes)["pypi"]],
        plan.python,
        **_cutoff(doc),
        preferences={n: str(e["version"]) for n, e in pyset["packages"].items()},
        arch=arch,
    )
    got = {n: e["version"] for n, e in res.packages.items()}
    want = {n: str(e["version"]) for n, e in pyset["packages"].items()}
    assert got == want
    # the collisions of the real metadata, settled the declared way
    assert "flash-attn-4" not in got
    assert got["transformers"] == "5.10.4" and Version(got["kernels"]) < Version("0.11")
    assert Version(got["setuptools"]) < Version("82") and got["triton"] == "3.6.0"  # torch's own pins


def test_without_the_overrides_the_real_stack_does_not_resolve(tmp_path, monkeypatch):
    """Proves the overrides are needed (a test that cannot fail is a defect): sglang's
    transformers==5.6.0 against verl's !=5.6.0."""
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    _m, doc, pyset = _lock()

    with pytest.raises(resolver.ResolutionFailed, match="transformers"):
        resolver.resolve(
            pyset["requirements"],
            pyset["stubs"],
            [],
            ["flash-attn-4"],
            ["https://pypi.org/simple"],
            "3.12",
            **_cutoff(doc),
        )


def test_every_locked_file_is_a_hashed_wheel_or_a_declared_sdist():
    m, doc, pyset = _lock()
    sdists = {s["package"] for s in (m.catalogue.data.get("resolution") or {}).get("sdists", [])}
    built = {n for n, p in m.catalogue.data["packages"].items() if p.get("build")}
    assert built >= {"transformer-engine-torch", "flash-attn", "apex"}
    for name, e in pyset["packages"].items():
        if str(e.get("source", "")).startswith("git"):
            continue
        if name in built:
            # compiled by the tool: pinned by its source (sdist sha256 or commit), not a file
            src = e["built_from"]
            assert len(src.get("sha256") or src.get("commit") or "") in (64, 40), name
            assert "file" not in e and "sha256" not in e, name
            continue
        assert e.get("verified") is not False, name  # nothing installs without a sha256
        assert len(e["sha256"]) == 64, name
        assert e["file"].endswith(".whl") or (e.get("sdist") and name in sdists), name
    # the sources' metadata was read from the pinned commits, not guessed
    assert Requirement(pyset["stubs"]["megatron-core"]["requires"][0]).name == "torch"
    assert pyset["stubs"]["megatron-core"]["version"] == "0.19.1"
    assert pyset["stubs"]["megatron-bridge"]["version"] == "0.6.1"
    assert all(c.get("verified") for c in doc["components"].values())
