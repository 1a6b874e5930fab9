"""Property-based: malformed manifests and flags never crash the tool.

Whatever the document, `check` ends with exit 0, 1 or 2; on failure stderr is one line
starting with "error:" per profile that does not load (#50: the others are still checked; one
line when none loads), never a traceback, never "internal error", and nothing under manifests/
is written. MTP_FUZZ_EXAMPLES raises the example count for a
longer local run.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mtpimage import cli

from .helpers import copy_manifests, snapshot

EXAMPLES = int(os.environ.get("MTP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="MTP_FUZZ_EXAMPLES" not in os.environ,  # CI: same examples every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            "..",
            "../../etc/passwd",
            "/etc/shadow",
            "$(id)",
            "`id`",
            "a\nRUN curl evil",
            "{{ 7*7 }}",
            "{% raw %}",
            "; rm -rf /",
            "main",
            "0" * 40,
            "Z" * 40,
            "sha256:" + "0" * 64,
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=8,
)


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def _assert_clean(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    # the tool's own internal-error line (not the words, which an arbitrary key may hold:
    # hypothesis once wrote a profile whose key was "internal error", named back as unknown)
    assert "Traceback" not in err and "(rerun with MTP_DEBUG=1 and report it)" not in err, err
    if code == 2:
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), err
        assert len(lines) == len(set(lines)), err  # an error several profiles share: once


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _fresh(workdir: Path) -> Path:
    return copy_manifests(workdir)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _mutate(doc, path, action, value):
    if not path:
        return value if action == "replace" else doc
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if action == "replace":
        parent[last] = value
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[f"{last}_extra"] = value
    return doc


@FUZZ
@given(
    data=st.data(),
    action=st.sampled_from(["replace", "delete", "add"]),
    value=values,
    target=st.sampled_from(["profiles/mtp-cp-recompute.yaml", "profiles/base.yaml", "components.yaml"]),
)
def test_mutated_manifests_never_crash(workdir, data, action, value, target):
    root = _fresh(workdir)
    path = root / target
    doc = yaml.safe_load(path.read_text())
    all_paths = list(_paths(doc))
    chosen = data.draw(st.sampled_from(all_paths))
    doc = _mutate(doc, chosen, action, value)
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    before = snapshot(root)
    code, _, err = _run(["check", "--manifests", str(root)])
    _assert_clean(code, err)
    assert snapshot(root) == before


@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_as_a_profile(workdir, text):
    root = _fresh(workdir)
    (root / "profiles" / "mtp-full.yaml").write_text(text, encoding="utf-8")
    code, _, err = _run(["check", "--manifests", str(root)])
    _assert_clean(code, err)


@FUZZ
@given(sets=st.lists(st.text(max_size=60), min_size=1, max_size=3))
@example(sets=["-:"])  # found by this test: argparse's multi-line usage error
def test_arbitrary_set_flags(sets):
    args = ["check", "--profile", "mtp-cp-recompute"]
    for s in sets:
        args += ["--set", s]
    code, _, err = _run(args)
    _assert_clean(code, err)


@FUZZ
@given(
    field=st.sampled_from(
        [
            "commit",
            "ref",
            "repo",
            "version",
            "source",
            "subdir",
            "index",
            "package",
            "layer",
            "extras",
            "patches",
            "strip",
        ]
    ),
    value=st.text(max_size=50),
    comp=st.sampled_from(["megatron-lm", "sglang", "verl", "torch", "mbridge"]),
)
@pytest.mark.parametrize(
    "command",
    [
        ["--profile", "mtp-cp-recompute", "--dry-run", "--json"],
        ["explain", "--profile", "mtp-cp-recompute", "--target", "rl"],
        ["explain", "--profile", "mtp-detach", "--target", "sft", "--json"],
    ],
)
def test_set_values_on_real_fields(command, field, value, comp):
    code, _, err = _run([*command, "--set", f"{comp}.{field}={value}"])
    _assert_clean(code, err)
