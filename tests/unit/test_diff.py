"""`python build.py diff A B`: profiles, version-vector files and images, text and --json."""

from __future__ import annotations

import copy
import io
import json
import re
import tarfile

import pytest

from mtpimage.cli import plan_for
from mtpimage.engine import containerengine as engine
from mtpimage.errors import InputError
from mtpimage.manifests import manifest
from mtpimage.outputs import vectordiff

from .helpers import REPO, assert_one_line_error, pin, run_main

CORE_V018 = "ba7b5ebce12af60627a80985792a1449ce45f46c"
CORE_V019 = pin("megatron-lm")  # the shipped pin
SGLANG_PATCH = (
    "ArronHZG/sglang 47e9ec11..99433255 (3 files), sha256 "
    "23f1b8d3852df6e4d48586b038d83d79ac08ba88f60ca3257277eaa6e214c8ca"
)


@pytest.fixture(scope="module")
def m():
    return manifest.load()


def plan(m, name, sets=None):
    return plan_for(m, name, sets)


def as_version_vector(p) -> dict:
    """The image stage's /opt/mtp/version.json layout (mtp-image-builder/version-vector/v1)."""
    d = p.to_dict()
    comps = [{k: v for k, v in c.items() if k != "subdir"} for c in d["components"]]
    return {
        "schema": "mtp-image-builder/version-vector/v1",
        "profile": p.profile,
        "summary": "not compared",
        "experimental": p.experimental,
        "mode": p.mode,
        "targets": d["targets"],
        "models": d["models"],
        "engine": d["engine"],
        "rollout_engine": p.rollout_engine,
        "python": p.python,
        "cuda": p.cuda,
        "base_image": p.base_image,
        "plan_digest": p.digest,
        "components": comps,
        "packages": d["packages"],
        "layers": d["layers"],
        "verl_overrides": d["verl_overrides"],
        "probes": [],
    }


def changes(m, a, b, sets_a=None, sets_b=None):
    return vectordiff.diff_vectors(
        vectordiff.side_from_plan(plan(m, a, sets_a)).vector,
        vectordiff.side_from_plan(plan(m, b, sets_b)).vector,
    )


# -- the must-show ---------------------------------------------------------------------------
def test_detach_vs_cp_recompute_is_exactly_the_recompute_and_cp_settings(m):
    cs = changes(m, "mtp-detach", "mtp-cp-recompute")
    assert {c.section for c in cs} == {"engine", "verl_overrides"}
    assert {c.field for c in cs if c.section == "engine"} == {"context_parallel_size", "recompute"}
    cp = next(c for c in cs if c.field == "context_parallel_size")
    assert (cp.a, cp.b) == (1, 2)
    rc = next(c for c in cs if c.field == "recompute")
    assert rc.a is None and rc.b == {"granularity": "full", "method": "uniform", "num_layers": 1}
    # Every override that differs is a CP or recompute override, added in B, for both targets:
    # both take the same mtp-only recipe (issue 45), which holds with and without recompute.
    b = plan(m, "mtp-cp-recompute")
    a = plan(m, "mtp-detach")
    for target in ("rl", "sft"):
        mine = [c for c in cs if c.section == "verl_overrides" and c.item == target]
        added = {f"{c.field}={c.b}" for c in mine if c.kind == "added"}
        assert added == set(b.verl_cli_overrides_for(target)) - set(a.verl_cli_overrides_for(target))
        assert added and all("context_parallel_size" in x or "recompute_" in x for x in added)
        removed = {f"{c.field}={c.a}" for c in mine if c.kind != "added"}
        assert removed == set(a.verl_cli_overrides_for(target)) - set(b.verl_cli_overrides_for(target))
        assert not removed
    # Same Megatron pin in every shipped profile: no component or package differs.
    assert not [c for c in cs if c.section in ("components", "packages", "platform", "layers")]


def test_cli_text_for_detach_vs_cp_recompute():
    proc = run_main("diff", "mtp-detach", "mtp-cp-recompute")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.match(r"A: mtp-detach  \(profile, plan [0-9a-f]{12}\)\nB: mtp-cp-recompute  ", out)
    assert "\nengine\n  context_parallel_size: 1 -> 2\n" in out
    assert '  recompute: (none) -> {"granularity": "full", "method": "uniform", "num_layers": 1}' in out
    assert "verl overrides (rl)\n" in out and "verl overrides (sft)\n" in out
    assert (
        "  + actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full" in out
    )
    assert "  + engine.context_parallel_size=2" in out
    assert "components" not in out
    assert "mtp_detach_heads" not in out  # the same recipe on both sides (issue 45)
    assert out.rstrip().endswith("11 differences")


def test_a_megatron_pin_difference_is_shown_when_present():
    """--set applies to B: `diff P P --set ...` shows what the pin change does to P."""
    proc = run_main(
        "diff", "mtp-cp-recompute", "mtp-cp-recompute", "--json", "--set", f"megatron-lm.commit={CORE_V018}"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["same"] is False
    diffs = {(d["section"], d["item"], d["field"]): (d["a"], d["b"]) for d in data["differences"]}
    assert diffs[("components", "megatron-lm", "commit")] == (CORE_V019, CORE_V018)
    assert diffs[("components", "megatron-lm", "ref")] == ("core_v0.19.0", "override")
    assert diffs[("components", "megatron-lm", "version")][1] is None
    # Megatron 0.18 has no mtp_detach_heads: the mtp-only recipe follows the pin (issue 45)
    others = [k for k in diffs if not (k[0] == "components" and k[1] == "megatron-lm")]
    assert others and all("mtp_recipe" in str(k) or "detach" in str(k) for k in others), others
    text = run_main(
        "diff", "mtp-detach", "mtp-cp-recompute", "--set", f"megatron-lm.commit={CORE_V018}"
    ).stdout
    assert f"components: megatron-lm\n  commit: {CORE_V019} -> {CORE_V018}" in text
    assert "context_parallel_size: 1 -> 2" in text  # the profile difference is still there


def test_set_a_changes_only_a(m):
    cs = changes(m, "mtp-detach", "mtp-detach", sets_a=[f"megatron-lm.commit={CORE_V018}"])
    commit = next(c for c in cs if c.field == "commit")
    assert (commit.a, commit.b) == (CORE_V018, CORE_V019)
    proc = run_main(
        "diff",
        "mtp-detach",
        "mtp-detach",
        "--set-a",
        f"megatron-lm.commit={CORE_V018}",
        "--set",
        f"megatron-lm.commit={CORE_V018}",
    )
    assert "no differences" in proc.stdout


def test_package_version_and_patches_are_shown(m):
    cs = changes(m, "mtp-detach", "mtp-detach", sets_b=["torch.version=2.10.0", "sglang.patches="])
    torch = next(c for c in cs if c.section == "packages")
    assert (torch.item, torch.field, torch.b) == ("torch", "version", "2.10.0")
    patches = next(c for c in cs if c.item == "sglang" and c.field == "patches")
    assert patches.b == [] and patches.a == [SGLANG_PATCH]
    proc = run_main("diff", "mtp-detach", "mtp-detach", "--set", "sglang.patches=")
    assert f"components: sglang\n  patch - {SGLANG_PATCH}\n" in proc.stdout


def test_a_patch_reads_the_same_from_a_plan_and_from_an_image_vector(m):
    """A plan side and an image's version vector name a patch by reference alike: by its
    repository, commits, files and sha256, so a profile compared with its image shows none."""
    from mtpimage.assembly.render import render

    p = plan(m, "mtp-rollout")
    vector = json.loads(render(p, m.root).files["mtp/version.json"])
    [entry] = next(c for c in vector["components"] if c["name"] == "sglang")["patches"]
    assert (entry["repo"], entry["base"], entry["head"]) == (
        "https://github.com/ArronHZG/sglang",
        "47e9ec11ad7a12b85aff4ed6efc5eb3a43961d16",
        "99433255ca365028b6c36d892ac67ac155e3d021",
    )
    image = vectordiff.side_from_vector("image", vector)
    assert image.vector["components"]["sglang"]["patches"] == [SGLANG_PATCH]
    assert vectordiff.side_from_plan(p).vector["components"]["sglang"]["patches"] == [SGLANG_PATCH]
    moved = copy.deepcopy(vector)
    next(c for c in moved["components"] if c["name"] == "sglang")["patches"][0]["head"] = "f" * 40
    [change] = [
        c for c in vectordiff.diff_vectors(image.vector, vectordiff.normalise(moved)) if c.field == "patches"
    ]
    assert change.b == [SGLANG_PATCH.replace("..99433255", "..ffffffff")]


def test_mode_targets_and_removed_target_overrides(m):
    cs = changes(m, "mtp-detach", "mtp-rollout")
    prof = {c.field: (c.a, c.b) for c in cs if c.section == "profile"}
    assert prof == {
        "mode": ("mtp-only", "rollout"),
        "experimental": (False, True),
        "targets": (["rl", "sft"], ["rl"]),
    }
    sft = [c for c in cs if c.item == "sft"]
    assert sft and all(c.kind == "removed" for c in sft)


def test_identical_profiles_have_no_differences_and_exit_code_flag():
    proc = run_main("diff", "mtp-full", "mtp-full")
    assert proc.returncode == 0 and "no differences in the version vectors" in proc.stdout
    assert run_main("diff", "mtp-full", "mtp-full", "--exit-code").returncode == 0
    assert run_main("diff", "mtp-full", "mtp-detach", "--exit-code").returncode == 1


def test_help_and_docs_say_diff_exits_0_when_the_sides_differ_without_exit_code():
    differ = run_main("diff", "mtp-full", "mtp-detach")
    assert differ.returncode == 0 and differ.stdout.strip()
    help_text = " ".join(run_main("diff", "--help").stdout.split())
    assert "Exit status: 0 whether or not A and B differ" in help_text, help_text
    assert "--exit-code exit 1 when A and B differ (without it diff exits 0 either way)" in help_text
    page = " ".join((REPO / "docs" / "build-test-publish.md").read_text().split())
    assert "`diff` exits 0 when A and B differ unless `--exit-code` is given" in page


# -- version vectors from images and files ---------------------------------------------------
def test_image_vector_equals_its_profile(m):
    """A vector in the image stage's format compares equal to the Plan it came from."""
    p = plan(m, "mtp-cp-recompute")
    image = vectordiff.side_from_vector("ghcr.io/a/mtp-verl:x", as_version_vector(p), kind="image")
    assert vectordiff.diff_vectors(vectordiff.side_from_plan(p).vector, image.vector) == []


def test_real_version_vector_module_is_compatible(m):
    from mtpimage.assembly import versionvector
    from mtpimage.assembly.recipe import recipe_of

    p = plan(m, "mtp-detach")
    side = vectordiff.side_from_vector("img", versionvector.version_vector(recipe_of(p)), kind="image")
    assert vectordiff.diff_vectors(vectordiff.side_from_plan(p).vector, side.vector) == []
    assert side.plan_digest == p.digest == vectordiff.side_from_plan(p).plan_digest


def test_image_vector_differences_are_found(m):
    p = plan(m, "mtp-detach")
    vec = as_version_vector(p)
    changed = copy.deepcopy(vec)
    mlm = next(c for c in changed["components"] if c["name"] == "megatron-lm")
    mlm["commit"], mlm["ref"] = CORE_V018, "core_v0.18.0"
    changed["base_image"] = "nvidia/cuda:13.0.2-devel-ubuntu24.04@sha256:" + "0" * 64
    changed["packages"] = [x for x in changed["packages"] if x["name"] != "apex"]
    changed["verl_overrides"]["rl"] = list(reversed(changed["verl_overrides"]["rl"]))
    cs = vectordiff.diff_vectors(
        vectordiff.side_from_vector("a", vec).vector, vectordiff.side_from_vector("b", changed).vector
    )
    keys = {(c.section, c.item, c.field) for c in cs}
    assert ("components", "megatron-lm", "commit") in keys
    assert ("components", "megatron-lm", "ref") in keys
    assert ("platform", "", "base_image") in keys and ("platform", "", "base_digest") in keys
    assert ("packages", "apex", "(entry)") in keys
    assert ("verl_overrides", "rl", vectordiff.ORDER) in keys
    text = vectordiff.format_text(
        vectordiff.side_from_vector("a", vec), vectordiff.side_from_vector("b", changed), cs
    )
    assert "packages: apex\n  - only in A" in text and "order differs:" in text


def test_wrapped_and_unknown_vectors(m):
    p = plan(m, "mtp-full")
    wrapped = vectordiff.normalise({"plan": p.to_dict(), "digest": p.digest})
    assert wrapped == vectordiff.normalise(p.to_dict())
    with pytest.raises(InputError, match="unknown schema"):
        vectordiff.normalise({"schema": "something/else", "components": []})
    with pytest.raises(InputError, match="JSON object"):
        vectordiff.normalise(["not", "a", "dict"])


def test_cli_diff_of_version_vector_files(m, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    vec = as_version_vector(plan(m, "mtp-detach"))
    a.write_text(json.dumps(vec))
    vec["engine"]["context_parallel_size"] = 8
    b.write_text(json.dumps(vec))
    proc = run_main("diff", str(a), str(b))
    assert proc.returncode == 0, proc.stderr
    assert "context_parallel_size: 1 -> 8" in proc.stdout and proc.stdout.rstrip().endswith("1 difference")
    proc = run_main("diff", "mtp-detach", str(b), "--json")
    data = json.loads(proc.stdout)
    assert data["b"]["kind"] == "file" and len(data["differences"]) == 1


def test_bad_sides_are_one_line_errors(tmp_path):
    assert_one_line_error(
        run_main("diff", "mtp-detach", "no-such-profile"), "no-such-profile", "mtp-cp-recompute"
    )
    assert_one_line_error(
        run_main("diff", "mtp-detach", "ghcr.io/a/img:1", "--set", "verl.ref=x"), "--set", "profiles only"
    )
    bad = tmp_path / "v.json"
    bad.write_text("{oops")
    assert_one_line_error(run_main("diff", "mtp-detach", str(bad)), "v.json")


# -- reading the vector out of an image (the engine seam, faked) -----------------------------
class FakeEngine(engine.ContainerEngine):
    """The primitives vector_from_image uses; ensure_local is the real one (engine.py)."""

    def __init__(self, labels, files, local=True):
        self.log: list = []
        self._labels, self.files, self.local = labels, files, local

    def image_id(self, ref):
        self.log.append(("get", ref))
        return "sha256:" + "1" * 64 if self.local else None

    def labels(self, ref):
        return dict(self._labels)

    def pull(self, ref):
        self.log.append(("pull", ref))
        raise engine.PullFailed(ref, "missing", f"manifest unknown: {ref}")

    def create(self, image, command):
        self.log.append(("create", image))
        return "c0ffee"

    def copy_out(self, container, path):
        self.log.append(("get_archive", path))
        if path not in self.files:
            return None
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            data = self.files[path]
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def remove(self, container):
        self.log.append(("remove", True))

    def describe(self):  # the rest is not used here
        raise NotImplementedError

    build = history = tag = untag = push = run = export = describe


def test_vector_from_image_reads_the_labelled_file_without_running(m):
    vec = as_version_vector(plan(m, "mtp-detach"))
    client = FakeEngine(
        {vectordiff.LABEL_VERSION_VECTOR: "/opt/mtp/version.json"},
        {"/opt/mtp/version.json": json.dumps(vec).encode()},
    )
    assert vectordiff.vector_from_image("ghcr.io/a/mtp-verl:t", client) == vec
    ops = [op[0] for op in client.log]
    assert ops == ["get", "create", "get_archive", "remove"]  # created, never started; removed
    assert ("remove", True) in client.log


def test_vector_from_image_defaults_path_and_accepts_inline_json(m):
    vec = as_version_vector(plan(m, "mtp-full"))
    client = FakeEngine({}, {vectordiff.DEFAULT_VECTOR_PATH: json.dumps(vec).encode()})
    assert vectordiff.vector_from_image("x/y:z", client)["mode"] == "full"
    inline = FakeEngine({vectordiff.LABEL_VERSION_VECTOR: json.dumps(vec)}, {})
    assert vectordiff.vector_from_image("x/y:z", inline) == vec
    assert [op[0] for op in inline.log] == ["get"]


def test_image_without_vector_or_missing_image_is_an_input_error():
    client = FakeEngine({}, {})
    with pytest.raises(InputError, match="no version vector at /opt/mtp/version.json"):
        vectordiff.vector_from_image("x/y:z", client)
    assert client.log[-1] == ("remove", True)  # the created container is removed
    gone = FakeEngine({}, {}, local=False)
    with pytest.raises(InputError, match="not in the local Docker engine, nor in registry ghcr.io"):
        vectordiff.vector_from_image("ghcr.io/x/y:z", gone)
    assert [op[0] for op in gone.log] == ["get", "pull"]
    # a name without a registry host is not looked up on docker.io (issue #13)
    bare = FakeEngine({}, {}, local=False)
    with pytest.raises(InputError, match="no such image in the local Docker engine"):
        vectordiff.vector_from_image("x/y:z", bare)
    assert [op[0] for op in bare.log] == ["get"]


def test_unreachable_docker_is_an_environment_error(tmp_path):
    proc = run_main(
        "diff",
        "mtp-detach",
        "ghcr.io/acme/mtp-verl:mtp-detach",
        env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"},
    )
    assert_one_line_error(
        proc, "the Docker engine cannot be reached at", "no-docker.sock (from DOCKER_HOST)", code=3
    )
