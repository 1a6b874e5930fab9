"""Hostile YAML in a manifest: self-referencing aliases, alias bombs (billion laughs), very
deep nesting and very large files are refused with one line naming the file and the line,
exit 2, before anything expands them; a YAML error on a file's last line names that line.

The CLI runs as users run it, in a separate process, under an address-space limit and a CPU
time limit (resource limits, not wall-clock assertions): a tool that expands the bomb runs
out of memory (exit 70) or is killed, and the test fails.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from mtpimage.manifests import yamlsource

from .helpers import REPO, assert_one_line_error, copy_manifests

PROFILE_FILE = ("profiles", "mtp-full.yaml")
MEMORY_LIMIT = 2 << 30  # bytes of address space for the CLI process
CPU_LIMIT_S = 30  # CPU seconds for the CLI process


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


def _check_limited(mdir) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MTP_DEBUG"}
    return subprocess.run(
        [sys.executable, str(REPO / "build.py"), "check", "--manifests", str(mdir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        preexec_fn=_limits,
    )


@pytest.fixture
def hostile(tmp_path):
    """Write TEXT as a profile file of a manifests copy; return (check result, file name)."""
    mdir = copy_manifests(tmp_path)
    path = mdir.joinpath(*PROFILE_FILE)

    def run(text: str):
        path.write_text(text)
        return _check_limited(mdir)

    return run


def _laughs(levels: int = 9, width: int = 10) -> str:
    lines = ["schema_version: 1", "extends: base", "lol0: &lol0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_self_referencing_alias_is_refused_at_its_line(hostile):
    proc = hostile("schema_version: 1\nextends: base\nloop: &loop\n  again: *loop\n")
    assert_one_line_error(proc, "profiles/mtp-full.yaml:4:", "alias *loop", "cycle")


def test_self_referencing_alias_in_a_sequence(hostile):
    proc = hostile("schema_version: 1\nengine: &e [1, *e]\n")
    assert_one_line_error(proc, "profiles/mtp-full.yaml:2:", "alias *e", "cycle")


def test_billion_laughs_is_refused_without_expanding(hostile):
    text = _laughs()
    proc = hostile(text)
    # the first collection whose expansion passes the bound is named by its line
    over, size = 0, 1 + 10  # lolN holds 10 copies of lolN-1: its expanded size
    while size <= yamlsource.MAX_NODES:
        over, size = over + 1, 1 + 10 * size
    line = 3 + over  # lol0 is on line 3
    assert_one_line_error(proc, f"profiles/mtp-full.yaml:{line}:", "expands to more than")


@pytest.mark.parametrize("shape", ["flow", "block-mapping", "block-sequence"])
def test_nesting_5000_levels_deep_is_refused(hostile, shape):
    depth = 5000
    if shape == "flow":
        text = "engine: " + "[" * depth + "]" * depth + "\n"
        line = 1
    elif shape == "block-mapping":
        depth = 900  # deeper would pass the size bound first (indentation grows)
        text = "".join(" " * i + "a:\n" for i in range(depth)) + " " * depth + "1\n"
        line = yamlsource.MAX_DEPTH
    else:
        text = "engine:\n" + "".join(" " * i + "-\n" for i in range(1, 1200))
        line = yamlsource.MAX_DEPTH + 1
    proc = hostile(text)
    assert_one_line_error(proc, f"profiles/mtp-full.yaml:{line}:", f"more than {yamlsource.MAX_DEPTH} levels")


def test_aliases_nested_through_each_other_are_bounded_in_depth(hostile):
    # each anchor holds 40 brackets around the previous one: fine alone, 400 deep expanded
    lines = ["schema_version: 1"]
    for i in range(10):
        inner = f"*a{i - 1}" if i else "1"
        lines.append(f"a{i}: &a{i} " + "[" * 40 + inner + "]" * 40)
    proc = hostile("\n".join(lines) + "\n")
    assert_one_line_error(proc, "profiles/mtp-full.yaml:3:", "once its aliases are expanded")


def test_huge_file_is_refused_before_it_is_read(hostile):
    proc = hostile("schema_version: 1\n" + "# padding\n" * (yamlsource.MAX_BYTES // 10 + 1))
    assert_one_line_error(proc, "profiles/mtp-full.yaml:", "bytes; a manifest may have at most")


def test_a_plain_alias_still_works():
    doc = yamlsource.load_text("a: &x {k: [1, 2]}\nb: *x\n", "f.yaml")
    assert doc.data == {"a": {"k": [1, 2]}, "b": {"k": [1, 2]}}
    assert doc.where(("b",)) == "f.yaml:2"


@pytest.mark.parametrize(
    "text, line",
    [
        ("schema_version: 1\nextends: base\nengine: [unclosed\n", 3),
        ("schema_version: 1\nextends: base\nengine: [unclosed", 3),
        ("schema_version: 1\nextends: base\nsummary: 'never closed\n", 3),
        # #50: the line of the unclosed brace, not the empty line where the parser gave up
        ("schema_version: 1\nextends: base\nengine: {a: 1\n\n", 3),
    ],
)
def test_yaml_error_on_the_last_line_names_that_line(hostile, text, line):
    proc = hostile(text)
    assert_one_line_error(proc, f"profiles/mtp-full.yaml:{line}:", "invalid YAML")
