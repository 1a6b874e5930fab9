"""The image workflow's own steps, without docker: the shared stack's key and Dockerfile
(stack.py), the disk check (diskcheck.py), the built-in CLI's cache options (dockerengine.py)
and the sign job's verify summary (workflow.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from mtpimage.assembly import diskcheck, stack
from mtpimage.assembly.render import render
from mtpimage.cli import plan_for
from mtpimage.engine.containerengine import BuildRequest
from mtpimage.engine.dockerengine import BuildKitCLI, build_argv
from mtpimage.errors import InputError
from mtpimage.imageref import Registry
from mtpimage.manifests import manifest
from mtpimage.outputs import workflow

from .helpers import REPO, run_main

SHIPPED = manifest.load(REPO / "manifests")
TESTS = manifest.load(REPO / "tests" / "manifests")


def _rendered(m, name, *sets):
    return render(plan_for(m, name, list(sets) or None), m.root)


# -- the shared stack -------------------------------------------------------------------------
@pytest.mark.parametrize("m", [SHIPPED, TESTS], ids=["shipped", "test"])
def test_profiles_with_equal_pins_share_one_stack(m):
    tags = {stack.stack_tag(_rendered(m, n)) for n in m.names()}
    assert len(tags) == 1, tags
    identities = {_rendered(m, n).identity for n in m.names()}
    assert len(identities) == len(m.names())  # the images differ; their stack does not


def test_the_stack_dockerfile_ends_before_the_mode_layer():
    r = _rendered(TESTS, "test-detach")
    cut = stack.stack_dockerfile(r)
    assert r.dockerfile.startswith(cut)
    assert "COPY mtp/ /opt/mtp/" not in cut and "COPY mtp/ /opt/mtp/" in r.dockerfile
    assert "MTP_PROFILE" not in cut
    assert stack.stack_rendered(r).files["Dockerfile"] == cut.encode()


def test_a_source_commit_is_part_of_the_key():
    r = _rendered(TESTS, "test-detach")
    comps = tuple(
        dataclasses.replace(c, commit="f" * 40) if c.name == "verl" else c for c in r.plan.components
    )
    moved = dataclasses.replace(
        r, recipe=dataclasses.replace(r.recipe, plan=dataclasses.replace(r.plan, components=comps))
    )
    assert stack.stack_key(moved) != stack.stack_key(r)


def test_a_dockerfile_without_one_mode_layer_is_refused():
    r = _rendered(TESTS, "test-detach")
    broken = dataclasses.replace(r, files={**r.files, "Dockerfile": b"FROM x\nRUN true\n"})
    with pytest.raises(stack.NoModeLayer, match="expected one"):
        stack.stack_key(broken)


def test_cache_sources_name_this_stack_then_the_last_one():
    r = _rendered(TESTS, "test-detach")
    reg = Registry.parse("127.0.0.1:5000/ns")
    assert stack.cache_sources(reg, r) == (
        f"type=registry,ref=127.0.0.1:5000/ns/mtp-verl:{stack.stack_tag(r)}",
        "type=registry,ref=127.0.0.1:5000/ns/mtp-verl:stack",
    )


def test_cache_from_args_prints_main_job_options():
    proc = run_main(
        "--manifests", str(REPO / "tests" / "manifests"), "stack", "--cache-from-args",
        "--profile", "test-detach", "--registry", "127.0.0.1:5000/ns",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0::2] == ["--cache-from", "--cache-from"]
    assert lines[1].startswith("type=registry,ref=127.0.0.1:5000/ns/mtp-verl:stack-")


def test_cache_from_args_without_registry_is_one_line_error():
    proc = run_main("stack", "--cache-from-args", "--profile", "mtp-detach")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--registry" in proc.stderr


# -- the built-in docker CLI's cache options --------------------------------------------------
def _argv(mode: str, **kw) -> list[str]:
    kit = BuildKitCLI("/usr/bin/docker", mode, "20.10")
    return build_argv(kit, BuildRequest(context_tar=b"", labels={}, **kw), Path("/tmp/iid"))


def test_builtin_cli_gets_references_and_the_inline_cache_build_arg():
    argv = _argv(
        "builtin", cache_from=("type=registry,ref=r:5000/a:stack-1", "r:5000/a:b"), cache_to=("type=inline",)
    )
    assert argv[argv.index("--cache-from") + 1] == "r:5000/a:stack-1"
    assert argv.count("--cache-from") == 2 and "r:5000/a:b" in argv
    assert argv[argv.index("--build-arg") + 1] == "BUILDKIT_INLINE_CACHE=1"
    assert "--cache-to" not in argv


def test_buildx_gets_the_specs_as_given():
    argv = _argv("buildx", cache_from=("type=registry,ref=r/a:s",), cache_to=("type=inline",))
    assert argv[argv.index("--cache-from") + 1] == "type=registry,ref=r/a:s"
    assert argv[argv.index("--cache-to") + 1] == "type=inline"


@pytest.mark.parametrize(
    "kw", [{"cache_to": ("type=registry,ref=r/a:c,mode=max",)}, {"cache_from": ("type=gha",)}]
)
def test_builtin_cli_refuses_what_it_cannot_do(kw):
    with pytest.raises(InputError, match="no buildx"):
        _argv("builtin", **kw)


# -- the disk check ---------------------------------------------------------------------------
def test_disk_check_passes_and_says_what_it_checked(tmp_path):
    said = []
    diskcheck.check(0.001, [tmp_path / "not-yet" / "made", tmp_path], "publish", say=said.append)
    assert len(said) == 1  # one filesystem, one line
    assert said[0].startswith("disk    publish job needs 0.001 GB for ")


def test_disk_check_stops_with_one_line_and_exit_3(tmp_path):
    proc = run_main("disk", "--job", "stack", "--need-gb", "1000000", "--path", str(tmp_path))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "the stack job needs 1e+06 GB free" in err[0] and "docs/ci.md" in err[0]
    assert "Traceback" not in proc.stderr


def test_the_reproducible_jobs_disk_check_covers_its_clean_builders_scratch(tmp_path, monkeypatch):
    from mtpimage.engine import SCRATCH_PARENT

    cache = tmp_path / "cache"
    assert diskcheck.default_paths("docker", cache) == [diskcheck.DOCKER_ROOT, cache]
    assert diskcheck.default_paths("buildah", cache) == [diskcheck.DOCKER_ROOT, cache, SCRATCH_PARENT]
    checked = []
    monkeypatch.setattr(diskcheck, "check", lambda need, paths, job, say: checked.append((job, need, paths)))
    for engine in ("buildah", "docker"):
        proc = run_main(
            "disk",
            "--job",
            "publish",
            "--need-gb",
            "52",
            "--engine",
            engine,
            env={"MTP_CACHE_DIR": str(cache)},
        )
        assert proc.returncode == 0, proc.stderr
    assert checked == [
        ("publish", 52.0, [diskcheck.DOCKER_ROOT, cache, SCRATCH_PARENT]),
        ("publish", 52.0, [diskcheck.DOCKER_ROOT, cache]),
    ]


def test_ci_settings_give_every_job_a_limit_and_the_building_ones_a_disk_need():
    jobs = workflow.ci_settings()["jobs"]
    assert set(jobs) == {
        "stack",
        "publish",
        "publish-arm64",
        "index",
        "test",
        "sign",
        "sign-arm64",
        "sign-index",
    }
    # every job of the generated workflow has its settings, and no setting is for a job it lacks
    generated = yaml.safe_load(workflow.render_workflows(manifest.load())[workflow.IMAGES_WORKFLOW])
    assert set(generated["jobs"]) == set(jobs)
    for name in ("stack", "publish", "publish-arm64", "test"):
        assert jobs[name]["disk_need_gb"] > 0
    assert all(j["timeout_minutes"] <= 360 for j in jobs.values())  # GitHub's hosted job limit


# -- verify -----------------------------------------------------------------------------------
def test_verify_summary_names_digest_identity_and_issuer():
    image = "ghcr.io/acme/mtp-verl@sha256:" + "ab" * 32
    proc = run_main("summary", "--profile", "mtp-detach", "--verify", image, "--signed-by", "Acme/builder")
    assert proc.returncode == 0, proc.stderr
    assert f"cosign verify {image}" in proc.stdout
    assert (
        "--certificate-identity-regexp '^https://github.com/Acme/builder/.github/workflows/images.yml@'"
        in (proc.stdout)
    )
    assert "--certificate-oidc-issuer https://token.actions.githubusercontent.com" in proc.stdout
    assert f"gh attestation verify oci://{image} --owner Acme" in proc.stdout
    assert (
        f"python3 build.py explain --profile mtp-detach --target rl --cluster slurm --registry ghcr.io/acme "
        f"--digest sha256:{'ab' * 32} --signed-by Acme/builder" in proc.stdout
    )


@pytest.mark.parametrize(
    "cluster,extra",
    [("slurm", []), ("apptainer", []), ("slurm", ["--nodes", "2"]), ("kuberay", ["--nodes", "2"])],
)
def test_job_scripts_say_how_to_verify_the_digest_before_pulling(cluster, extra):
    digest = "sha256:" + "cd" * 32
    args = ["explain", "--profile", "mtp-detach", "--target", "rl", "--cluster", cluster, *extra]
    args += ["--registry", "ghcr.io/acme", "--digest", digest, "--signed-by", "Acme/builder"]
    proc = run_main(*args)
    assert proc.returncode == 0, proc.stderr
    head = [line for line in proc.stdout.splitlines() if line.startswith("#")]
    image = f"ghcr.io/acme/mtp-verl@{digest}"
    assert f"#   cosign verify {image} \\" in head
    assert (
        "#     --certificate-identity-regexp '^https://github.com/Acme/builder/.github/workflows/images.yml@' \\"
        in head
    )
    assert f"#   gh attestation verify oci://{image} --owner Acme" in head


def _slurm_job(digest: str, *extra: str):
    return run_main(
        "explain", "--profile", "mtp-detach", "--target", "rl", "--cluster", "slurm",
        "--registry", "ghcr.io/acme", "--digest", digest, *extra,
    )  # fmt: skip


def test_job_script_without_a_signer_names_the_placeholder_and_the_fix(monkeypatch):
    monkeypatch.delenv("MTP_SIGNED_BY", raising=False)
    digest = "sha256:" + "cd" * 32
    proc = _slurm_job(digest)
    assert proc.returncode == 0, proc.stderr
    assert "github.com/OWNER/REPO/.github/workflows/images.yml@" in proc.stdout
    assert "--signed-by or MTP_SIGNED_BY fills it in" in proc.stdout
    bad = _slurm_job(digest, "--signed-by", "no-slash")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--signed-by" in bad.stderr
