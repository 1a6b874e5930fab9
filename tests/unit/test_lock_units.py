"""Unit tests of the lock's pure parts: source probes on small trees, the lock file's
bytes, --frozen, git error classification, index rewrites, stub wheels. No network."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from mtpimage import gitfetch
from mtpimage.cli import plan_for
from mtpimage.errors import InputError
from mtpimage.lock import lockfile, probes, pydeps
from mtpimage.manifests import manifest
from mtpimage.plan.rules import FAIL, PASS

from .helpers import REPO


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))


MTP = """
class MultiTokenPredictionLayer:
    def forward(self, hidden_states, attention_mask, padding_mask=None):
        pass

    def _checkpointed_forward(self, hidden_states, attention_mask{extra}):
        pass
"""


@pytest.mark.parametrize("extra,status", [("", FAIL), (", padding_mask=None", PASS), (", **kwargs", PASS)])
def test_recompute_probe(tmp_path, extra, status):
    write(tmp_path, probes.MTP_FILE, MTP.format(extra=extra))
    assert probes.recompute_signature(tmp_path).status == status


def test_recompute_probe_generic_forward_without_padding_mask(tmp_path):
    write(
        tmp_path,
        probes.MTP_FILE,
        """
        class MultiTokenPredictionLayer:
            def forward(self, hidden_states):
                pass
            def _checkpointed_forward(self, forward_func, *args, **kwargs):
                pass
        """,
    )
    assert probes.recompute_signature(tmp_path).status == PASS


def test_mbridge_probe_ignores_examples_and_reads_megatron_enum(tmp_path):
    mb, mc = tmp_path / "mb", tmp_path / "mc"
    write(mb, "example/run.py", "x = ModelType.encoder_and_decoder\n")
    write(mb, "mbridge/core.py", "x = ModelType.encoder_or_decoder\n")
    write(mc, probes.ENUMS_FILE, "import enum\nclass ModelType(enum.Enum):\n    encoder_or_decoder = 1\n")
    assert probes.mbridge_modeltype(mb, "mbridge", mc).status == PASS
    write(
        mb, "mbridge/bridge.py", "from megatron.core import enums\nx = enums.ModelType.encoder_and_decoder\n"
    )
    v = probes.mbridge_modeltype(mb, "mbridge", mc)
    assert v.status == FAIL and "mbridge/bridge.py:2" in v.detail
    write(
        mc, probes.ENUMS_FILE, "class ModelType:\n    encoder_or_decoder = 1\n    encoder_and_decoder = 2\n"
    )
    assert probes.mbridge_modeltype(mb, "mbridge", mc).status == PASS


def test_sglang_and_bridge_probes(tmp_path):
    write(tmp_path, "python/" + probes.SGLANG_RUNNER, "def other():\n    pass\n")
    write(tmp_path, "python/" + probes.SGLANG_EAGLE, "x = 1\n")
    assert probes.sglang_fix(tmp_path).status == FAIL
    write(tmp_path, "python/" + probes.SGLANG_RUNNER, "def unwrap_ipc_tensors(t, r, d):\n    return t\n")
    write(tmp_path, "python/" + probes.SGLANG_EAGLE, "y = unwrap_ipc_tensors([], 0, None)\n")
    assert probes.sglang_fix(tmp_path).status == PASS
    assert probes.bridge_mimo(tmp_path).status == FAIL
    write(tmp_path, "src/" + probes.MIMO_BRIDGE, "class MimoBridge:\n    m = 'mtp.layers.*.enorm.weight'\n")
    assert probes.bridge_mimo(tmp_path).status == PASS


def test_patch_paths_strip_like_patch(tmp_path):
    """patch_paths strips like `patch -pN`: with -p2 the a/python/ of a repository diff goes,
    leaving wheel (site-packages) paths, as for the shipped sglang patch."""
    diff = tmp_path / "fix.patch"
    diff.write_text(
        "diff --git a/python/pkg/mod.py b/python/pkg/mod.py\n--- a/python/pkg/mod.py\n"
        "+++ b/python/pkg/mod.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
        "diff --git a/python/pkg/new.py b/python/pkg/new.py\n--- /dev/null\n"
        "+++ b/python/pkg/new.py\n@@ -0,0 +1 @@\n+y = 1\n"
    )
    assert probes.patch_paths(diff, 2) == ["pkg/mod.py", "pkg/new.py"]
    assert probes.patch_paths(diff, 1) == ["python/pkg/mod.py", "python/pkg/new.py"]


def test_git_error_classification():
    off = gitfetch.GitError(
        "https://github.com/x/y", "fetch", "fatal: Could not resolve host: github.com", "a" * 40
    )
    assert off.offline and not off.missing
    gone = gitfetch.GitError(
        "https://github.com/x/y", "fetch", "fatal: read error: Connection reset by peer", "a" * 40
    )
    assert not gone.offline and not gone.missing
    assert "github.com/x/y" in str(gone) and "a" * 40 in str(gone) and "Connection reset" in str(gone)
    miss = gitfetch.GitError("r", "fetch", "fatal: remote error: upload-pack: not our ref abc")
    assert miss.missing


def test_fetch_rejects_non_sha_without_touching_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_CACHE_DIR", str(tmp_path))
    with pytest.raises(gitfetch.GitError):
        gitfetch.fetch("https://example.invalid/r", "main")
    assert not (tmp_path / "git").exists()


def test_index_rewrite(monkeypatch):
    monkeypatch.setenv(
        "MTP_INDEX_REWRITE", "https://pypi.org/simple=http://mirror/pypi;https://pypi.org=http://x"
    )
    assert pydeps.rewrite("https://pypi.org/simple") == "http://mirror/pypi"
    assert pydeps.rewrite("https://download.pytorch.org/whl") == "https://download.pytorch.org/whl"


def test_stub_wheel_is_deterministic_and_carries_requirements(tmp_path):
    a = pydeps.write_stub_wheel(tmp_path, "megatron-core", "0.19.0", ["torch>=2.6"], {"dev": ["einops"]})
    first = a.read_bytes()
    b = pydeps.write_stub_wheel(tmp_path, "megatron-core", "0.19.0", ["torch>=2.6"], {"dev": ["einops"]})
    assert b.read_bytes() == first
    meta = zipfile.ZipFile(b).read("megatron_core-0.19.0.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.6" in meta and 'Requires-Dist: einops; extra == "dev"' in meta


def test_lock_dump_is_stable_and_write_is_atomic(tmp_path):
    doc = {"schema": lockfile.LOCK_SCHEMA, "b": {"z": 1, "a": [1, 2]}, "a": "x"}
    text = lockfile.dumps(doc)
    assert text.startswith("# GENERATED by `python3 build.py lock`")
    assert text.index("\nb:") < text.index("\na:")  # insertion order, not re-sorted
    path = tmp_path / "lock.yaml"
    assert lockfile.write(path, doc) is True
    assert lockfile.write(path, doc) is False  # same bytes: not rewritten
    assert path.read_text() == text
    assert not list(tmp_path.glob(".lock-*"))


def _lock_for(m, plan) -> dict:
    from mtpimage.commands.lock import cmd_lock  # noqa: F401 - module imports cleanly

    base = lockfile.base_pin(plan)
    return {
        "schema": lockfile.LOCK_SCHEMA,
        "target": {"python": plan.python},
        "base_image": base,
        "components": {
            c.name: {
                **lockfile.component_pin(c),
                "verified": False,
                "patches": [lockfile.patch_pin(p) for p in c.patches],
            }
            for c in plan.components
        },
        "packages": {p.name: lockfile.package_pin(p) for p in plan.packages},
        "profiles": {
            plan.profile: {
                "components": sorted(c.name for c in plan.components),
                "packages": sorted(p.name for p in plan.packages),
            }
        },
    }


def test_check_frozen_names_the_drifted_component():
    m = manifest.load()
    plan = plan_for(m, "mtp-detach", None)
    lock = _lock_for(m, plan)
    lockfile.check_frozen(m, plan, lock)  # consistent: no error
    lock["components"]["megatron-lm"]["commit"] = "0" * 40
    with pytest.raises(InputError) as exc:
        lockfile.check_frozen(m, plan, lock)
    assert "megatron-lm" in str(exc.value) and "lock --upgrade megatron-lm" in str(exc.value)
    lock = _lock_for(m, plan)
    lock["packages"]["torch"]["version"] = "2.10.0+cu130"
    with pytest.raises(InputError, match="package torch drifted"):
        lockfile.check_frozen(m, plan, lock)
    other = plan_for(m, "mtp-detach", ["sglang.version=0.5.11"])
    with pytest.raises(InputError, match="sglang"):
        lockfile.check_frozen(m, other, _lock_for(m, plan))


@pytest.mark.parametrize(
    "field,value",
    [
        ("head", "f" * 40),
        ("base", "e" * 40),
        ("sha256", "d" * 64),
        ("strip", 1),
        ("paths", ["python/sglang/srt/x.py"]),
    ],
)
def test_check_frozen_compares_every_field_of_a_patch_by_reference(field, value):
    m = manifest.load()
    plan = plan_for(m, "mtp-rollout", None)
    lock = _lock_for(m, plan)
    lockfile.check_frozen(m, plan, lock)
    [entry] = lock["components"]["sglang"]["patches"]
    entry.update(checked_with="patch --dry-run", applies=True, made_with="git diff ...")  # records, not pins
    lockfile.check_frozen(m, plan, lock)
    entry[field] = value
    with pytest.raises(InputError) as exc:
        lockfile.check_frozen(m, plan, lock)
    msg = str(exc.value)
    assert (
        msg.startswith(
            "manifests/lock.yaml: components.sglang.patches: component sglang drifted: patch 0 "
            f"{field}: manifests "
        )
        and repr(value) in msg
        and "\n" not in msg
    )
    # the old vendored-file form of the same pin is drift too
    lock["components"]["sglang"]["patches"] = [
        {
            "file": "patches/sglang/0001-unwrap-ipc-tensors-once.patch",
            "sha256": plan.component("sglang").patches[0].sha256,
            "strip": 2,
        }
    ]
    with pytest.raises(InputError, match="patch 0 file: manifests None"):
        lockfile.check_frozen(m, plan, lock)


def test_dry_run_frozen_stops_on_a_lock_that_drifted(tmp_path, capsys):
    """#36 item 10: `--dry-run --frozen` checks the lock as the build would (exit 2, naming it)."""
    import shutil

    from mtpimage import cli

    m = Path(
        shutil.copytree(
            manifest.load().root, tmp_path / "manifests", ignore=shutil.ignore_patterns("lock.yaml")
        )
    )
    mm = manifest.load(m)
    lockfile.write(m / "lock.yaml", _lock_for(mm, plan_for(mm, "mtp-detach", None)))
    args = ["--manifests", str(m), "--profile", "mtp-detach", "--frozen", "--dry-run"]
    assert cli.main(args) == 0
    cat = m / "components.yaml"
    verl = mm.catalogue.data["components"]["verl"]["commit"]
    cat.write_text(cat.read_text().replace(verl, "a" * 40))
    capsys.readouterr()
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "component verl drifted" in err and "lock --upgrade verl" in err


@pytest.mark.parametrize("version,status", [("0.13.0", FAIL), ("0.14.0rc1", FAIL), ("0.14.0", PASS)])
def test_mtp_context_parallel_probe_reads_the_version_the_source_builds(tmp_path, version, status):
    """#36 item 7: the probe decides from the source (its own metadata), not from the manifest."""
    from mtpimage.plan import rules

    write(
        tmp_path,
        "pyproject.toml",
        f'[project]\nname = "megatron-core"\nversion = "{version}"\ndependencies = []\n',
    )
    v = probes.mtp_cp(tmp_path, rules.facts())
    assert v.status == status and version in v.detail, v


def test_a_cuda_toolkit_wheel_of_another_minor_fails_the_lock_unless_declared():
    """#36 item 6: sglang 0.5.13's lock added nvidia-cuda-nvcc 13.2.86 to a CUDA 13.0 stack
    without a word; the libraries' own numbering (cuBLAS 13.1.0.3 is CUDA 13.0's) is not judged."""
    import dataclasses

    from mtpimage.lock.pythonset import PythonSets

    class Sets(PythonSets):
        def __init__(self):
            self.failures = []

    plan = plan_for(manifest.load(), "mtp-detach", None)
    assert plan.cuda.startswith("13.0")
    resolved = {
        "nvidia-cuda-nvcc": {"version": "13.2.86", "via": ["sglang"]},
        "nvidia-cuda-crt-cu13": {"version": "13.5.37", "via": ["nvidia-cuda-nvcc"]},
        "nvidia-cuda-runtime": {"version": "13.0.96", "via": ["cuda-toolkit"]},
        "nvidia-cublas": {"version": "13.1.0.3", "via": ["cuda-toolkit"]},
    }
    s = Sets()
    s._cuda_line(plan, resolved, "k")
    assert len(s.failures) == 2, s.failures
    assert (
        "nvidia-cuda-nvcc 13.2.86 is CUDA 13.2, the base image is CUDA 13.0.2 (required by sglang)"
        in s.failures[1]
    )
    declared = dataclasses.replace(
        plan,
        resolution_overrides=plan.resolution_overrides
        + (("nvidia-cuda-nvcc==13.2.86", "why", "link"), ("nvidia-cuda-crt-cu13>=13.5", "why", "link")),
    )
    s = Sets()
    s._cuda_line(declared, resolved, "k")
    assert s.failures == []


def test_an_override_records_what_it_covers_and_names_a_declaration_nobody_reviewed(tmp_path):
    """#36 item 6: with sglang 0.5.13 the transformers override silently replaced sglang's
    transformers==5.8.1 while its record said 5.6.0: the lock records what each override
    covers (who, requirement, read from the wheel) and prints the one the record lacks."""
    from types import SimpleNamespace

    from mtpimage.lock import pythonset

    m = manifest.load()
    plan = plan_for(m, "mtp-detach", None)
    wheel = tmp_path / "sglang"
    write(wheel, "sglang-0.5.12.dist-info/METADATA", "Name: sglang\nRequires-Dist: transformers==5.6.0\n")

    class Sets(pythonset.PythonSets):
        def __init__(self):
            self.m, self.ss, self.notes = m, SimpleNamespace(trees={"sglang": wheel}), []

    def covers(sets):
        s = pythonset._SetInputs(indexes={}, used=[], reach={})
        doc = {
            "overrides": [{"requirement": r, "why": w, "link": ln} for r, w, ln in plan.resolution_overrides]
        }
        sets._override_covers(plan, s, doc)
        return {o["requirement"]: o["covers"] for o in doc["overrides"]}

    sets = Sets()
    assert covers(sets)["transformers==5.10.4"] == ["sglang 0.5.12: transformers==5.6.0"]
    assert sets.notes == []  # components.yaml records exactly that
    write(wheel, "sglang-0.5.12.dist-info/METADATA", "Name: sglang\nRequires-Dist: transformers==5.8.1\n")
    sets = Sets()
    covers(sets)
    [note] = sets.notes
    assert note.startswith("override transformers==5.10.4 now covers sglang 0.5.12: transformers==5.8.1;")
    assert "components.yaml records sglang 0.5.12: transformers==5.6.0" in note


@pytest.mark.parametrize("failure", ["patch", "set", "probe"])
def test_frozen_refuses_a_lock_that_records_a_failure(failure):
    """#36 item 1: locks written by the tool before #36 recorded failures (a patch that does not
    apply, `packages: {}` of a set that did not resolve, a failed probe) and `check` said ok:
    such a lock stops a frozen build as drift does."""
    m = manifest.load()
    plan = plan_for(m, "mtp-rollout", None)
    lock = _lock_for(m, plan)
    lock["profiles"]["mtp-rollout"]["python_set"] = "k"
    lock["python_sets"] = {"k": {"resolved": True}}
    lockfile.check_frozen(m, plan, lock)
    if failure == "patch":
        lock["components"]["sglang"]["patches"][0]["applies"] = False
    elif failure == "set":
        lock["python_sets"]["k"]["resolved"] = False
    else:
        lock["profiles"]["mtp-rollout"]["probes"] = {"sglang-rollout-fix": {"status": "fail", "detail": "x"}}
    with pytest.raises(InputError, match="records a"):
        lockfile.check_frozen(m, plan, lock)


def test_messages_name_the_lock_that_manifests_points_at(tmp_path, monkeypatch):
    """#38 item 5: `--manifests ELSEWHERE` is named as such, not as the checkout's manifests/."""
    from mtpimage.lock import lockfile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "manifests").mkdir()
    assert lockfile.shown(Path("manifests")) == "manifests/lock.yaml"
    elsewhere = tmp_path.parent / "site-manifests"
    assert lockfile.shown(elsewhere) == str(elsewhere / "lock.yaml")
    assert lockfile.shown(elsewhere, "components.yaml") == str(elsewhere / "components.yaml")


def test_the_frozen_fix_locks_and_commits_the_manifests_that_manifests_points_at(tmp_path, monkeypatch):
    """#38 item 5, the frozen check's side: `--manifests ELSEWHERE` drifted is fixed by locking
    ELSEWHERE and committing ELSEWHERE/lock.yaml, not the checkout's manifests/."""
    import shutil

    elsewhere = tmp_path / "site-manifests"
    shutil.copytree(REPO / "manifests", elsewhere)
    m = manifest.load(elsewhere)
    plan = plan_for(m, "mtp-detach", None)
    lock = _lock_for(m, plan)
    lock["components"]["megatron-lm"]["commit"] = "0" * 40
    with pytest.raises(InputError) as exc:
        lockfile.check_frozen(m, plan, lock)
    assert exc.value.fix.startswith(
        f"run `python3 build.py lock --manifests {elsewhere}` (or `lock --upgrade megatron-lm`) "
        f"and commit {elsewhere / 'lock.yaml'}, "
    )
    monkeypatch.chdir(REPO)  # the checkout's own manifests: the plain command, relative path
    shipped = manifest.load()
    plan = plan_for(shipped, "mtp-detach", None)
    lock = _lock_for(shipped, plan)
    del lock["profiles"]["mtp-detach"]
    with pytest.raises(InputError) as exc:
        lockfile.check_frozen(shipped, plan, lock)
    assert exc.value.fix == "run `python3 build.py lock --profile mtp-detach`"
