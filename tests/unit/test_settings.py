"""The one settings object (mtpimage/settings.py): every MTP_* variable read once per
environment into a frozen object, documented in docs/environment.md's one table, and the substitutions'
flags, which win over their variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpimage import cli, settings
from mtpimage.commands.load import plan_for
from mtpimage.errors import InputError
from mtpimage.plan import substitute

REPO = Path(__file__).resolve().parents[2]
SCRIPT_ONLY = {"MTP_REAL_STACK_OUT"}  # read by scripts/real-stack/build.sh, not by the package


def _documented(text: str) -> set[str]:
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(MTP_[A-Z_]+)` \|", section, re.M))


def test_the_docs_table_lists_exactly_the_variables():
    assert _documented((REPO / "docs" / "environment.md").read_text()) == settings.NAMES | SCRIPT_ONLY


def test_the_table_check_can_fail():
    text = (REPO / "docs" / "environment.md").read_text()
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| `MTP_ENGINE` |"))
    assert "MTP_ENGINE" not in _documented(without)
    assert _documented(without) != settings.NAMES | SCRIPT_ONLY


def test_settings_are_frozen_and_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "a"))
    first = settings.current()
    assert first.cache_root == tmp_path / "a" and settings.current() is first  # read once
    with pytest.raises(AttributeError):
        first.raw = ()
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "b"))
    assert settings.current().cache_root == tmp_path / "b"  # a new environment is read again
    monkeypatch.delenv("MTP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.current().cache_root == tmp_path / "xdg" / "mtp-image-builder"


def test_one_cache_root():
    from mtpimage import gitfetch
    from mtpimage.assembly import fastpath

    assert gitfetch.cache_root() == settings.current().cache_root
    assert fastpath.memo_dir().parent == settings.current().cache_root


def test_an_unknown_name_is_a_programming_error():
    with pytest.raises(KeyError):
        settings.current().get("MTP_NO_SUCH_THING")


def test_the_older_docker_cli_name_is_read_when_the_new_one_is_unset():
    env = {"MTP_DOCKER_BUILDKIT_CLI": "/old"}
    assert settings.from_environ(env).docker_cli == "/old"
    assert settings.from_environ({**env, "MTP_DOCKER_CLI": "/new"}).docker_cli == "/new"


def test_substitution_flags_win_over_their_variables(monkeypatch):
    m = cli.load_for(cli.make_parser().parse_args([]))
    base = "127.0.0.1:5000/stand-in:1@sha256:" + "a" * 64
    monkeypatch.setenv("MTP_SUBSTITUTE_BASE", "127.0.0.1:5000/other:1@sha256:" + "b" * 64)
    by_flag = plan_for(m, "mtp-detach", None, base=base, omit=("flash-attn",))
    assert by_flag.base_image == base and "flash-attn" not in {p.name for p in by_flag.packages}
    monkeypatch.delenv("MTP_SUBSTITUTE_BASE")
    monkeypatch.setenv("MTP_OMIT_PACKAGES", "flash-attn")
    by_var = plan_for(m, "mtp-detach", None, base=base)
    assert by_var.digest == by_flag.digest  # the same substitutions, the same identity
    with pytest.raises(InputError, match="--omit-packages: not a package"):
        substitute.apply(plan_for(m, "mtp-detach", None), omit=("nope",))


def test_the_flags_parse_on_the_main_job_and_the_commands():
    parser = cli.make_parser()
    args = parser.parse_args(["--substitute-base", "x", "--omit-packages", "a,b c"])
    from mtpimage.commands.load import substitutions_of

    assert substitutions_of(args) == {"base": "x", "omit": ("a", "b", "c")}
    args = parser.parse_args(["check", "--omit-packages", "apex"])
    assert substitutions_of(args) == {"base": None, "omit": ("apex",)}
