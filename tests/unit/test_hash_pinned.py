"""Rule hash-pinned (issue #22): nothing installs by version alone. A locked row without a
sha256 fails the rule with one line naming the package and its index, and render refuses it
too (UnpinnedPackage); a package the tool compiles has no file row but passes when its
source is pinned (sdist by sha256, git by a 40-hex commit). The shipped lock is the plan."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml

from mtpimage.assembly.recipe import UnpinnedPackage
from mtpimage.assembly.render import render
from mtpimage.commands.load import plan_for
from mtpimage.manifests import manifest
from mtpimage.plan import rules

from .helpers import MANIFESTS, run_cli

PROFILE = "mtp-detach"
VICTIM = "einops"  # a PyPI wheel of the extensions layer, locked by sha256


def _plan():
    return plan_for(manifest.load(), PROFILE, None)


def _verdict(plan) -> rules.RuleResult:
    return next(r for r in rules.evaluate(plan) if r.rule.id == "hash-pinned")


def _without_hash(plan, name: str):
    rows = tuple(dataclasses.replace(r, file="", sha256="") if r.name == name else r for r in plan.locked)
    assert rows != plan.locked, f"{name} is not in the lock"
    return dataclasses.replace(plan, locked=rows)


def test_the_shipped_lock_passes_with_built_packages_that_have_no_file_row():
    plan = _plan()
    built = {p.name for p in plan.packages if p.build is not None}
    assert built >= {"flash-attn", "apex", "transformer-engine-torch"}
    # the built packages ARE locked rows without a file: the rule must exempt them by name
    assert {r.name for r in plan.locked if not r.sha256} == built
    r = _verdict(plan)
    assert r.status == rules.PASS, r.detail
    render(plan, manifest.load().root)  # no UnpinnedPackage


def test_a_row_without_sha256_fails_the_rule_in_one_line_naming_package_and_index():
    plan = _without_hash(_plan(), VICTIM)
    r = _verdict(plan)
    assert r.status == rules.FAIL and r.violated
    assert r.detail == f"{VICTIM}==0.8.2 (index pypi): no sha256"
    with pytest.raises(UnpinnedPackage) as exc:
        render(plan, manifest.load().root)
    line = exc.value.one_line()
    assert line == str(exc.value) and "\n" not in line
    assert line.startswith(f"{VICTIM} from index pypi would install without a sha256 (fix: ")


@pytest.mark.parametrize(
    "name, unpin",
    [
        ("flash-attn", {"sha256": None}),  # an sdist without its hash
        ("apex", {"commit": "master"}),  # a git source by branch name
    ],
)
def test_a_built_package_whose_source_is_not_pinned_fails(name, unpin):
    plan = _plan()
    packages = tuple(
        dataclasses.replace(p, build=dataclasses.replace(p.build, **unpin)) if p.name == name else p
        for p in plan.packages
    )
    r = _verdict(dataclasses.replace(plan, packages=packages))
    assert r.status == rules.FAIL
    assert r.detail == f"{name}: source not pinned"


def test_check_and_render_refuse_a_lock_with_a_hashless_row(tmp_path):
    """The CLI path: a lock.yaml whose einops row lost its file and sha256 (as an index
    that did not answer at lock time used to leave it)."""
    m = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, m)
    lock = m / "lock.yaml"
    doc = yaml.safe_load(lock.read_text())
    for pyset in doc["python_sets"].values():
        row = pyset["packages"][VICTIM]
        del row["file"], row["sha256"]
    lock.write_text(yaml.safe_dump(doc, sort_keys=False))
    check = run_cli("--manifests", str(m), "check", "--profile", PROFILE)
    assert check.returncode == 1, check.stdout + check.stderr
    assert f"ERROR hash-pinned: {VICTIM}==0.8.2 (index pypi): no sha256." in check.stdout
    out = run_cli("--manifests", str(m), "render", "--profile", PROFILE, "--out", str(tmp_path / "r"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: {VICTIM} from index pypi would install without a sha256 (fix: `python3 build.py lock` "
        "where the index answers, or build it from a pinned source)"
    ]
    assert not (tmp_path / "r" / "Dockerfile").exists()
