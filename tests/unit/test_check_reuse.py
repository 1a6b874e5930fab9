"""Checks that cannot have changed are reused (mtpimage/assembly/checkreuse.py, imagetest.run_checks,
run_checks.py --reuse): an image whose layers below the mode layer are those of an image
that passed reports those groups `reused`, proved by that image's ID; --full-checks runs
them. The container is replaced by running images/checks/run_checks.py on this interpreter
with a version vector of our own (no Docker)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mtpimage.assembly import checkreuse, imagetest
from mtpimage.assembly.render import IMAGES_DIR

SCRIPT = IMAGES_DIR / "checks" / "run_checks.py"
LOWER = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
HISTORY = [
    (1000, "RUN /bin/bash -o pipefail -euc pip install torch # buildkit"),
    (100, "COPY mtp/ /opt/mtp/ # buildkit"),
    (0, "ENV MTP_VERSION_VECTOR=/opt/mtp/version.json MTP_PROFILE=test-detach MTP_MODE=mtp-only"),
    (0, "LABEL io.mtp-image-builder.profile=test-detach"),
]
ENV = ["PATH=/opt/venv/bin:/usr/bin", "MTP_PROFILE=test-detach", "MTP_MODE=mtp-only"]
VECTOR = {"mode": "mtp-only", "components": [], "packages": [], "python_packages": {}, "probes": {}}


def _mode(profile: str) -> tuple[list, list, list]:
    """(layers, env, history) of an image of `profile` on the lower layers LOWER."""
    top = "sha256:" + hashlib.sha256(profile.encode()).hexdigest()
    env = [e.replace("test-detach", profile) for e in ENV]
    history = [(s, c.replace("test-detach", profile)) for s, c in HISTORY]
    return [*LOWER, top], env, history


def test_the_key_is_the_lower_layers_and_their_environment():
    detach = checkreuse.lower_key(*_mode("test-detach"))
    assert detach and detach == checkreuse.lower_key(*_mode("test-cp-recompute"))  # mode layer only
    layers, env, history = _mode("test-detach")
    assert checkreuse.lower_key(["sha256:" + "c" * 64, *layers[1:]], env, history) != detach
    assert checkreuse.lower_key(layers, [*env, "LD_LIBRARY_PATH=/x"], history) != detach


def test_an_image_without_the_mode_layer_on_top_has_no_key():
    layers, env, history = _mode("test-detach")
    later = [*history, (10, "RUN touch /opt/mtp/x # buildkit")]  # something on top of it
    assert checkreuse.lower_key(layers, env, later) is None
    assert checkreuse.lower_key(layers, env, history[:1]) is None


# ----------------------------------------------------------------------- in the image
@pytest.fixture
def rc(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_checks_reuse", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    path = tmp_path / "version.json"
    path.write_text(json.dumps(VECTOR))
    monkeypatch.setattr(mod, "VECTOR", path)
    return mod


def test_a_group_is_reused_only_with_the_inputs_it_was_proved_with(rc):
    digest = rc.inputs_digest("versions", VECTOR)
    [placeholder] = rc.run(only=["versions"], reuse={"versions": digest})
    assert placeholder["status"] == rc.REUSED and placeholder["inputs"] == digest
    changed = {**VECTOR, "packages": [{"name": "torch", "version": "2.11.0"}]}
    assert rc.inputs_digest("versions", changed) != digest
    [ran] = rc.run(only=["versions"], reuse={"versions": "sha256:" + "0" * 64})
    assert ran["status"] != rc.REUSED and ran["inputs"] == digest


def test_groups_that_read_the_mode_layer_are_never_reused(rc):
    assert rc.inputs_digest("login-shell", VECTOR) is None
    assert set(rc.REUSABLE) == {"imports", "pip-check", "versions", "probes", "entry-imports"}
    assert rc.inputs_digest("entrypoints", VECTOR) is None  # composes with the mode's overrides


def test_every_result_says_its_group_and_time(rc):
    for r in rc.run(only=["versions", "cuda-runtime"]):
        assert r["group"] in ("versions", "cuda-runtime") and isinstance(r["seconds"], float)


# ----------------------------------------------------------------------- on the host
class FakeEngine:
    """Images are (layers, env, history); `run` runs run_checks.py here, as the image would."""

    def __init__(self, vector_path):
        self.images: dict[str, tuple] = {}
        self.vector_path = vector_path
        self.commands: list[list[str]] = []

    def ensure_local(self, ref, flag=None):
        pass

    def image_id(self, ref):
        return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()

    def rootfs(self, ref):
        return self.images[ref][:2]

    def history(self, ref):
        return self.images[ref][2]

    def run(self, image, command, gpu=False, timeout=900):
        self.commands.append(command)
        argv = [sys.executable, str(SCRIPT), *command[2:], "--only", "versions", "entrypoints"]
        env = {"MTP_VERSION_VECTOR": str(self.vector_path), "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        return SimpleNamespace(exit_code=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


@pytest.fixture
def host(tmp_path, monkeypatch):
    vector = tmp_path / "version.json"
    vector.write_text(json.dumps({**VECTOR, "packages": [{"name": "pip", "version": _pip()}]}))
    fake = FakeEngine(vector)
    fake.images = {"detach": _mode("test-detach"), "recompute": _mode("test-cp-recompute")}
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path / "cache"))
    return fake


def _pip() -> str:
    from importlib.metadata import version

    return version("pip")


def _by_id(report):
    return {r["id"]: r for r in report.results}


def test_a_mode_layer_change_reuses_what_the_lower_layers_proved(host, tmp_path):
    first = imagetest.run_checks("detach", host)
    assert first.ok and _by_id(first)["versions"]["status"] == "pass"
    assert list((tmp_path / "cache" / "checks").glob("*.json"))  # in the tool's cache root
    second = imagetest.run_checks("recompute", host)
    versions = _by_id(second)["versions"]
    assert versions["status"] == "reused" and versions["was"] == "pass"
    assert versions["proved_by"] == host.image_id("detach")
    assert versions["seconds"] == 0.0  # the time was the proving run's, not this one's
    assert _by_id(second)["entrypoints"]["status"] != "reused"  # reads the mode layer: runs
    table = second.table()
    assert "REUSED versions" in table and f"proved by {host.image_id('detach')[:19]}" in table
    assert "1 reused" in table.splitlines()[-1]
    assert second.ok


def test_full_checks_run_everything_and_an_other_lower_layer_reuses_nothing(host):
    imagetest.run_checks("detach", host)
    full = imagetest.run_checks("recompute", host, full=True)
    assert "--reuse" not in host.commands[-1]
    assert _by_id(full)["versions"]["status"] == "pass"
    layers, env, history = _mode("test-rollout")
    host.images["other"] = (["sha256:" + "9" * 64, *layers[1:]], env, history)
    assert _by_id(imagetest.run_checks("other", host))["versions"]["status"] == "pass"


def test_a_failed_group_is_not_recorded(host, tmp_path):
    host.vector_path.write_text(json.dumps({**VECTOR, "packages": [{"name": "pip", "version": "0.0.1"}]}))
    assert _by_id(imagetest.run_checks("detach", host))["versions"]["status"] == "fail"
    assert _by_id(imagetest.run_checks("recompute", host))["versions"]["status"] == "fail"
    assert "--reuse" not in host.commands[-1]


def test_an_image_from_before_reuse_runs_everything(host, monkeypatch):
    imagetest.run_checks("detach", host)
    real_run = host.run

    def old_script(image, command, gpu=False, timeout=900):
        if "--reuse" in command:
            return SimpleNamespace(exit_code=2, stdout="", stderr="error: unrecognized arguments: --reuse")
        return real_run(image, command, gpu, timeout)

    monkeypatch.setattr(host, "run", old_script)
    report = imagetest.run_checks("recompute", host)
    assert report.ok and _by_id(report)["versions"]["status"] == "pass"


def test_a_placeholder_without_its_record_fails():
    placeholder = {
        "id": "imports",
        "group": "imports",
        "status": "reused",
        "inputs": "sha256:1",
        "detail": "",
    }
    [r] = checkreuse.expand([placeholder], {"groups": {}})
    assert r["status"] == "fail"


def test_proofs_of_other_inputs_stay_side_by_side():
    record = {"groups": {}}
    for image, inputs in (("sha256:1", "sha256:a"), ("sha256:2", "sha256:b")):
        result = {"id": "probes", "group": "probes", "status": "pass", "inputs": inputs, "detail": image}
        assert checkreuse.remember(record, [result], image)
    assert checkreuse.reuse_args(record) == ["--reuse", "probes=sha256:a", "--reuse", "probes=sha256:b"]
    placeholder = {"id": "probes", "group": "probes", "status": "reused", "inputs": "sha256:a"}
    [r] = checkreuse.expand([placeholder], record)
    assert (r["status"], r["proved_by"], r["detail"]) == ("reused", "sha256:1", "sha256:1")


def test_entry_checks_count_only_for_the_group_that_runs_them(rc):
    """A profile with fewer targets (fewer verl entry checks) reuses pip-check, versions and
    probes, but not entry-imports."""
    verl = {"name": "verl", "package": "verl", "commit": "7bc80c00"}
    both = {**VECTOR, "components": [{**verl, "entry_checks": [{"id": "rl"}, {"id": "sft"}]}]}
    rl_only = {**VECTOR, "components": [{**verl, "entry_checks": [{"id": "rl"}]}]}
    other_commit = {**VECTOR, "components": [{**verl, "commit": "0000000", "entry_checks": [{"id": "rl"}]}]}
    for gid in ("pip-check", "versions", "probes"):
        assert rc.inputs_digest(gid, rl_only) == rc.inputs_digest(gid, both), gid
        assert rc.inputs_digest(gid, other_commit) != rc.inputs_digest(gid, rl_only), gid
    assert rc.inputs_digest("entry-imports", rl_only) != rc.inputs_digest("entry-imports", both)


def test_a_reused_skip_is_shown_as_a_skip_not_as_reused():
    """#38 item 5: "no component declares entry checks" proves nothing; REUSED reads as a pass."""
    record = {"groups": {}}
    skipped = {
        "id": "entry-sft",
        "group": "entry-sft",
        "status": "skip",
        "inputs": "sha256:a",
        "detail": "no component declares entry checks of this kind",
    }
    checkreuse.remember(record, [skipped], "sha256:1")
    placeholder = {"id": "entry-sft", "group": "entry-sft", "status": "reused", "inputs": "sha256:a"}
    [r] = checkreuse.expand([placeholder], record)
    assert (r["status"], r["was"], r["proved_by"]) == ("skip", "skip", "sha256:1")
