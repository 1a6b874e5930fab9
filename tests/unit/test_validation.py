"""Bad manifests: one-line errors naming file, line and key; exit 2; nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .helpers import assert_one_line_error, copy_manifests, edit_yaml, pin, run_main, snapshot


@pytest.fixture
def mdir(tmp_path: Path) -> Path:
    return copy_manifests(tmp_path)


def check(mdir: Path, *extra: str):
    before = snapshot(mdir.parent)
    proc = run_main("check", "--manifests", str(mdir), *extra)
    assert snapshot(mdir.parent) == before, "a failed check must not write anything"
    return proc


def test_shipped_manifests_are_valid(mdir):
    proc = check(mdir)
    assert proc.returncode == 0, proc.stderr


def test_bad_yaml_names_file_and_line(mdir):
    p = mdir / "profiles" / "mtp-full.yaml"
    p.write_text(p.read_text() + "engine: [unclosed\n")
    err = assert_one_line_error(check(mdir), "profiles/mtp-full.yaml:", "invalid YAML")
    line = int(err.split("mtp-full.yaml:")[1].split(":")[0])
    assert line >= len(p.read_text().splitlines()) - 1


def test_unknown_key_names_key_and_allowed(mdir):
    p = mdir / "profiles" / "mtp-detach.yaml"
    p.write_text(p.read_text() + "colour: blue\n")
    n = len(p.read_text().splitlines())
    assert_one_line_error(check(mdir), f"profiles/mtp-detach.yaml:{n}", "colour", "unknown key")


def test_wrong_type(mdir):
    p = mdir / "profiles" / "mtp-cp-recompute.yaml"
    p.write_text(p.read_text().replace("context_parallel_size: 2", "context_parallel_size: two"))
    assert_one_line_error(
        check(mdir), "mtp-cp-recompute.yaml:", "engine.context_parallel_size", "expected an integer"
    )


def test_short_commit(mdir):
    c = mdir / "components.yaml"
    c.write_text(c.read_text().replace(f"commit: {pin('megatron-lm')}", "commit: 5be9626"))
    assert_one_line_error(check(mdir), "components.yaml:", "components.megatron-lm.commit", "40-hex")


def test_a_39_hex_commit_says_how_to_get_the_full_one(mdir):
    import re

    c = mdir / "components.yaml"
    text = c.read_text()
    full = re.search(r"commit: ([0-9a-f]{40})", text).group(1)
    c.write_text(text.replace(f"commit: {full}", f"commit: {full[:39]}", 1))
    assert_one_line_error(
        check(mdir),
        "components.yaml:",
        ".commit: expected a full 40-hex git commit",
        "(fix: ",
        "git rev-parse",
    )
    proc = run_main("check", "--profile", "mtp-cp-recompute", "--set", f"megatron-lm.commit={full[:39]}")
    assert_one_line_error(proc, "--set", "megatron-lm.commit", "(fix: ", "git ls-remote")


def test_short_commit_on_command_line():
    proc = run_main("check", "--profile", "mtp-cp-recompute", "--set", "megatron-lm.commit=5be9626")
    assert_one_line_error(proc, "--set", "megatron-lm.commit", "40-hex")


def test_unknown_set_field():
    proc = run_main("check", "--profile", "mtp-detach", "--set", "megatron-lm.colour=red")
    assert_one_line_error(proc, "--set", "megatron-lm.colour", "unknown key")


def test_inheritance_cycle(mdir):
    edit_yaml(mdir / "profiles" / "base.yaml", lambda d: d.update(extends="mtp-detach"))
    assert_one_line_error(check(mdir), "inheritance cycle", "extends")


def test_missing_parent(mdir):
    edit_yaml(mdir / "profiles" / "mtp-full.yaml", lambda d: d.update(extends="nope"))
    assert_one_line_error(check(mdir), "mtp-full.yaml:", "parent profile 'nope' not found")


def test_duplicate_profile_names(mdir):
    src = (mdir / "profiles" / "mtp-full.yaml").read_text()
    (mdir / "profiles" / "zz-copy.yaml").write_text(src)
    assert_one_line_error(check(mdir), "zz-copy.yaml:", "duplicate profile name 'mtp-full'")


def test_duplicate_yaml_key(mdir):
    p = mdir / "profiles" / "mtp-full.yaml"
    p.write_text(p.read_text() + "mode: load-only\n")
    assert_one_line_error(check(mdir), "mtp-full.yaml:", "duplicate key")


SITE_PATCH = "patches/site/0001-fix.patch"


def _site_patch(mdir: Path, **entry) -> dict:
    """Add a site's own patch file to sglang (index 1, after the shipped reference)."""
    body = b"--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+fix\n"
    (mdir / SITE_PATCH).parent.mkdir(parents=True, exist_ok=True)
    (mdir / SITE_PATCH).write_bytes(body)
    patch = {
        "file": SITE_PATCH,
        "sha256": hashlib.sha256(body).hexdigest(),
        "url": "https://example.org/fix",
        **entry,
    }
    edit_yaml(mdir / "components.yaml", lambda d: d["components"]["sglang"]["patches"].append(patch))
    return patch


def _sglang_ref(mdir: Path, change) -> None:
    edit_yaml(mdir / "components.yaml", lambda d: change(d["components"]["sglang"]["patches"][0]))


def test_site_patch_file_is_accepted(mdir):
    _site_patch(mdir)
    assert check(mdir).returncode == 0


def test_missing_patch_file(mdir):
    _site_patch(mdir)
    (mdir / SITE_PATCH).unlink()
    assert_one_line_error(check(mdir), "components.yaml:", "patches[1].file", "not found")


def test_wrong_patch_sha256(mdir):
    _site_patch(mdir)
    (mdir / SITE_PATCH).write_text("changed\n")
    assert_one_line_error(check(mdir), "components.yaml:", "patches[1].sha256", "review the file")


def test_patch_path_outside_manifests(mdir):
    _site_patch(mdir)
    c = mdir / "components.yaml"
    c.write_text(c.read_text().replace("file: patches/site/0001", "file: patches/../../etc/0001"))
    assert_one_line_error(check(mdir), "components.yaml:", "patches.1.file")


@pytest.mark.parametrize("key", ["repo", "base", "head"])
def test_patch_reference_without_a_commit_or_repo_names_the_key(mdir, key):
    _sglang_ref(mdir, lambda p: p.pop(key))
    assert_one_line_error(
        check(mdir), "components.yaml:", f"patches[0].{key}", f"missing required key '{key}'", "merge-base"
    )


def test_patch_is_a_file_or_a_reference_not_both(mdir):
    _sglang_ref(mdir, lambda p: p.update(file=SITE_PATCH))
    assert_one_line_error(check(mdir), "components.yaml:", "patches[0].repo", "not both")


def test_patch_base_and_head_must_differ(mdir):
    _sglang_ref(mdir, lambda p: p.update(head=p["base"]))
    assert_one_line_error(check(mdir), "components.yaml:", "patches[0].head", "same commit")


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("head", "99433255", "40-hex"),
        ("base", "main", "40-hex"),
        ("repo", "git@github.com:ArronHZG/sglang", "does not match"),
        ("repo", "https://github.com/a/$(id)", "does not match"),
        ("paths", ["../etc/passwd"], "not allowed"),
        ("paths", [":(glob)**/*.py"], "file path inside the repository"),
        ("paths", ["-p0"], "file path inside the repository"),
        ("paths", ["/etc/passwd"], "file path inside the repository"),
        ("paths", [], "must not be empty"),
    ],
)
def test_patch_reference_values_are_checked(mdir, key, value, needle):
    _sglang_ref(mdir, lambda p: p.update({key: value}))
    assert_one_line_error(check(mdir), "components.yaml:", f"patches.0.{key}", needle)


def test_missing_required_key_names_file(mdir):
    edit_yaml(mdir / "profiles" / "base.yaml", lambda d: d.pop("rollout"))
    assert_one_line_error(check(mdir), "rollout", "missing required key")


def test_wrong_schema_version(mdir):
    edit_yaml(mdir / "profiles" / "mtp-full.yaml", lambda d: d.update(schema_version=2))
    assert_one_line_error(check(mdir), "mtp-full.yaml:", "schema_version", "expected 1")


def test_unknown_profile():
    assert_one_line_error(run_main("check", "--profile", "mtp-nope"), "unknown profile", "mtp-detach")


def test_unknown_layer(mdir):
    edit_yaml(mdir / "components.yaml", lambda d: d["components"]["verl"].update(layer="nowhere"))
    assert_one_line_error(check(mdir), "components.verl.layer", "unknown layer")


def test_top_level_not_mapping(mdir):
    (mdir / "profiles" / "mtp-full.yaml").write_text("- just\n- a list\n")
    assert_one_line_error(check(mdir), "mtp-full.yaml", "mapping")


def test_a_mode_refuses_a_target_it_does_not_run_for(mdir):
    # verl.yaml: the rollout mode runs for rl only (verl's SFT trainer has no rollout)
    p = mdir / "profiles" / "mtp-rollout.yaml"
    p.write_text(p.read_text().replace("targets: [rl]", "targets: [rl, sft]"))
    line = next(i for i, t in enumerate(p.read_text().splitlines(), 1) if t.startswith("targets:"))
    assert_one_line_error(
        check(mdir), f"profiles/mtp-rollout.yaml:{line}", "targets", "rollout runs for rl only, not sft"
    )
