"""#36 item 3: a site adds facts (known-bad/good commits, version bounds) in its manifests,
in the schema of mtpimage/data/rules.yaml's `facts:`, validated, each shown with its file:line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mtpimage.manifests import manifest

from .helpers import assert_one_line_error, run_main

BAD = "ab" * 20


def _site(tmp_path, text: str) -> Path:
    root = Path(
        shutil.copytree(
            manifest.load().root, tmp_path / "manifests", ignore=shutil.ignore_patterns("lock.yaml")
        )
    )
    (root / "facts.yaml").write_text(text)
    return root


def test_a_site_fact_decides_a_rule_and_says_where_it_came_from(tmp_path):
    root = _site(
        tmp_path,
        f"schema_version: 1\nfacts:\n  megatron:\n    commits:\n      {BAD}: {{ref: bisected here, padding_mask_bug: true}}\n",
    )
    args = (
        "check",
        "--manifests",
        str(root),
        "--profile",
        "mtp-cp-recompute",
        "--set",
        f"megatron-lm.commit={BAD}",
    )
    proc = run_main(*args, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    r = next(r for r in json.loads(proc.stdout)[0]["rules"] if r["id"] == "recompute-padding-mask")
    assert r["status"] == "fail" and "(site fact, manifests/facts.yaml:5)" in r["detail"], r
    text = run_main(*args)
    assert (
        f"site facts (1, merged over the tool's): facts.megatron.commits.{BAD} (manifests/facts.yaml:5)"
        in text.stdout
    )


def test_a_site_fact_the_rules_do_not_use_is_one_line(tmp_path):
    root = _site(tmp_path, "schema_version: 1\nfacts:\n  megatron:\n    comits: {}\n")
    assert_one_line_error(
        run_main("check", "--manifests", str(root)),
        "facts.yaml:4",
        "facts.megatron.comits",
        "not a fact the rules use",
    )
    root = _site(
        tmp_path / "b", f"schema_version: 1\nfacts:\n  megatron:\n    commits:\n      {BAD}: {{ref: x}}\n"
    )
    assert_one_line_error(
        run_main("check", "--manifests", str(root)), "facts.yaml:5", "missing padding_mask_bug"
    )


def test_a_site_says_where_its_own_patch_fits(tmp_path):
    """#36 item 5: the patches table is keyed by sha256; a site's entry for a patch of its own
    decides patches-apply offline (no lock here), and names its file and line."""
    sha = "cd" * 32
    root = _site(
        tmp_path,
        "schema_version: 1\nfacts:\n  patches:\n"
        f"    {sha}: {{component: sglang, fits: ['0.5.12'], ref: checked here}}\n",
    )
    from tests.unit.helpers import edit_yaml

    edit_yaml(root / "components.yaml", lambda d: d["components"]["sglang"]["patches"][0].update(sha256=sha))
    proc = run_main("check", "--manifests", str(root), "--profile", "mtp-detach", "--json")
    r = next(r for r in json.loads(proc.stdout)[0]["rules"] if r["id"] == "patches-apply")
    assert r["status"] == "pass" and "(site fact, manifests/facts.yaml:4)" in r["detail"], r
