"""Bad manifests: one-line errors naming file, line and key; exit 2; nothing written."""
from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import assert_one_line_error, copy_manifests, edit_yaml, run_cli, snapshot


@pytest.fixture
def mdir(tmp_path: Path) -> Path:
    return copy_manifests(tmp_path)


def check(mdir: Path, *extra: str):
    before = snapshot(mdir.parent)
    proc = run_cli("check", "--manifests", str(mdir), *extra)
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
    assert_one_line_error(check(mdir), "mtp-cp-recompute.yaml:", "engine.context_parallel_size",
                          "expected an integer")


def test_short_commit(mdir):
    c = mdir / "components.yaml"
    c.write_text(c.read_text().replace("commit: 5be9626709af2722333bf54797c954c09edeada3",
                                       "commit: 5be9626"))
    assert_one_line_error(check(mdir), "components.yaml:", "components.megatron-lm.commit",
                          "40-hex")


def test_short_commit_on_command_line():
    proc = run_cli("check", "--profile", "mtp-cp-recompute", "--set", "megatron-lm.commit=5be9626")
    assert_one_line_error(proc, "--set", "megatron-lm.commit", "40-hex")


def test_unknown_set_field():
    proc = run_cli("check", "--profile", "mtp-detach", "--set", "megatron-lm.colour=red")
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


def test_missing_patch_file(mdir):
    (mdir / "patches" / "sglang" / "0001-unwrap-ipc-tensors-once.patch").unlink()
    assert_one_line_error(check(mdir), "components.yaml:", "patches[0].file", "not found")


def test_wrong_patch_sha256(mdir):
    p = mdir / "patches" / "sglang" / "0001-unwrap-ipc-tensors-once.patch"
    p.write_text(p.read_text() + "\n")
    assert_one_line_error(check(mdir), "components.yaml:", "patches[0].sha256", "re-vendor")


def test_patch_path_outside_manifests(mdir):
    c = mdir / "components.yaml"
    c.write_text(c.read_text().replace("file: patches/sglang/0001", "file: patches/../../etc/0001"))
    assert_one_line_error(check(mdir), "components.yaml:", "patches.0.file")


def test_missing_required_key_names_file(mdir):
    edit_yaml(mdir / "profiles" / "base.yaml", lambda d: d.pop("rollout"))
    assert_one_line_error(check(mdir), "rollout", "missing required key")


def test_wrong_schema_version(mdir):
    edit_yaml(mdir / "profiles" / "mtp-full.yaml", lambda d: d.update(schema_version=2))
    assert_one_line_error(check(mdir), "mtp-full.yaml:", "schema_version", "expected 1")


def test_unknown_profile():
    assert_one_line_error(run_cli("check", "--profile", "mtp-nope"), "unknown profile", "mtp-detach")


def test_unknown_layer(mdir):
    edit_yaml(mdir / "components.yaml",
              lambda d: d["components"]["verl"].update(layer="nowhere"))
    assert_one_line_error(check(mdir), "components.verl.layer", "unknown layer")


def test_top_level_not_mapping(mdir):
    (mdir / "profiles" / "mtp-full.yaml").write_text("- just\n- a list\n")
    assert_one_line_error(check(mdir), "mtp-full.yaml", "mapping")
