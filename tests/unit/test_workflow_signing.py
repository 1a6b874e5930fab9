"""Every digest the image workflow pushes for users to pull is attested and signed (issue 49):
the linux/amd64 image, the linux/arm64 image and the multi-arch index of each profile.

The check is derived from the workflow's text, not from a list of job names: which jobs push
an image is read from their commands (parsed by the CLI's own parser), what each sign job
signs from its attestation and cosign steps and where their digest comes from. So a job that
pushes without a sign job after it, or a sign job that signs another digest, fails here."""

from __future__ import annotations

import copy
import re
import shlex

import pytest

from mtpimage.cli import make_parser
from mtpimage.manifests import manifest
from mtpimage.outputs import workflow
from mtpimage.publish.baseplatform import BUILD_PLATFORM

from .helpers import run_main
from .test_workflow import load, steps

# Jobs that write packages but push nothing a user pulls to run, and why.
CACHE_ONLY = {
    "stack": "the shared stack (REG/mtp-verl:stack-KEY) and the extension wheels: caches of the "
    "other jobs' builds, never pulled to run",
}
STEP_DIGEST = re.compile(r"^\$\{\{ steps\.([\w-]+)\.outputs\.digest \}\}$")
NEEDS_DIGEST = re.compile(
    r"^\$\{\{ needs\.([\w-]+)\.outputs\[format\('\{0\}-digest', matrix\.profile\)\] \}\}$"
)


@pytest.fixture(scope="module")
def images() -> dict:
    return load(workflow.render_workflows(manifest.load())[workflow.IMAGES_WORKFLOW])


def commands(step: dict) -> list[list[str]]:
    """argv after `build.py` of each `python build.py` line of a run step, with the step's own
    env values put in for "$NAME" (the matrix's profile stays its expression)."""
    env = step.get("env") or {}
    out = []
    for line in step.get("run", "").replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("mapfile -t cache < <(").split(" >> ")[0].split(" | ")[0].rstrip(")")
        line = line.replace('"${cache[@]}"', "")  # the test job's cache options: not a push
        line = re.sub(r'^sudo -E env (?:"\w+=\$\w+" )+\s*', "", line)
        if not line.startswith("python build.py"):
            continue
        line = re.sub(r"\$(\w+)", lambda m: str(env.get(m.group(1), m.group(1))), line)
        out.append(shlex.split(line)[2:])
    return out


def _platform(args) -> str:
    sets = dict(s.split("=", 1) for s in (args.sets or []))
    return sets.get("builds.platform", BUILD_PLATFORM)


def pushed(job: dict) -> tuple | None:
    """What a job pushes for users: ("image", platform, profile) for the main build with --push,
    ("index", profile) for `build.py index`; None for anything else."""
    parser = make_parser()
    for step in steps(job):
        for argv in commands(step):
            if argv[0] == "index":
                return ("index", parser.parse_args(argv).profile)
            if argv[0] == "--profile":
                args = parser.parse_args(argv)
                if args.push:
                    return ("image", _platform(args), args.profile)
    return None


def _needs(job: dict) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def _from_published(job: dict, step_id: str, name: str) -> tuple:
    """The subject a `build.py published` step finds: that platform's image of the profile."""
    at = [s.get("id") for s in steps(job)].index(step_id)
    step = steps(job)[at]
    assert name == f"${{{{ steps.{step_id}.outputs.name }}}}", name
    assert '>> "$GITHUB_OUTPUT"' in step["run"]
    (argv,) = commands(step)
    args = make_parser().parse_args(argv)
    assert argv[0] == "published", argv
    return ("image", _platform(args), args.profile)


def _from_needs(job: dict, jobs: dict, source: str, name: str) -> tuple:
    """The subject a job's output names: each profile's pair, set by the leg of that profile
    from the step that pushed it (the matrix pattern of images.yml.j2's index job)."""
    assert source in _needs(job), (source, _needs(job))
    assert name == f"${{{{ needs.{source}.outputs[format('{{0}}-name', matrix.profile)] }}}}", name
    producer = jobs[source]
    profiles = [e["profile"] for e in producer["strategy"]["matrix"]["include"]]
    for p in profiles:
        for key in ("name", "digest"):
            value = producer["outputs"][f"{p}-{key}"]
            m = re.fullmatch(
                rf"\$\{{\{{ matrix\.profile == '{re.escape(p)}' && steps\.([\w-]+)\.outputs\.{key} \|\| '' \}}\}}",
                value,
            )
            assert m, (source, p, key, value)
            step = next(s for s in steps(producer) if s.get("id") == m.group(1))
            assert '>> "$GITHUB_OUTPUT"' in step["run"] and pushed({"steps": [step]}), step
    return pushed(producer)


def signed(job: dict, jobs: dict) -> tuple:
    """What a sign job attests and signs, and that both name one digest."""
    attest = next(s for s in steps(job) if s.get("uses", "").startswith("actions/attest-build-provenance@"))
    name, digest = attest["with"]["subject-name"], attest["with"]["subject-digest"]
    assert attest["with"].get("push-to-registry") == "true"
    sign = next(s for s in steps(job) if s.get("id") == "cosign-sign")
    assert sign["env"]["IMAGE"] == f"{name}@{digest}", sign["env"]
    assert 'cosign sign --yes "$IMAGE"' in sign["run"]
    names = [s.get("uses", "") for s in steps(job)]
    assert any(n.startswith("sigstore/cosign-installer@") for n in names[: steps(job).index(sign)])
    if m := STEP_DIGEST.match(digest):
        return _from_published(job, m.group(1), name)
    if m := NEEDS_DIGEST.match(digest):
        return _from_needs(job, jobs, m.group(1), name)
    raise AssertionError(f"a digest this test cannot trace to a push: {digest}")


def unsigned(images: dict) -> list[str]:
    """Each job that pushes what users pull with no sign job after it that attests and signs
    that digest, for the same profiles; and each job that writes packages unexplained."""
    jobs = images["jobs"]
    signers = {n for n, j in jobs.items() if j.get("permissions", {}).get("id-token") == "write"}
    covered = set()
    for name in signers:
        subject = signed(jobs[name], jobs)
        for source in _needs(jobs[name]):
            same = jobs[source].get("strategy") == jobs[name].get("strategy")
            if same and pushed(jobs[source]) == subject:
                covered.add(source)
    problems = []
    for name, job in jobs.items():
        if name in signers or name in CACHE_ONLY:
            continue
        what = pushed(job)
        if what is None and job.get("permissions", {}).get("packages") == "write":
            problems.append(f"{name}: writes packages, pushes nothing this test can read")
        elif what is not None and name not in covered:
            problems.append(f"{name}: pushes {what} unsigned")
    return problems


def test_every_pushed_digest_is_attested_and_signed(images):
    assert unsigned(images) == []
    subjects = {pushed(j) for j in images["jobs"].values()} - {None}
    profile = "${{ matrix.profile }}"
    assert subjects == {
        ("image", "linux/amd64", profile),
        ("image", "linux/arm64", profile),
        ("index", profile),
    }


def test_a_push_without_its_sign_job_fails_the_check(images):
    for sign, source in (("sign", "publish"), ("sign-arm64", "publish-arm64"), ("sign-index", "index")):
        broken = copy.deepcopy(images)
        del broken["jobs"][sign]
        assert unsigned(broken) == [f"{source}: pushes {pushed(images['jobs'][source])} unsigned"], sign


def test_a_sign_job_that_signs_another_digest_fails_the_check(images):
    # the arm64 sign job finding the amd64 image's digest: the arm64 image is unsigned
    broken = copy.deepcopy(images)
    find = next(s for s in steps(broken["jobs"]["sign-arm64"]) if s.get("id") == "published")
    find["run"] = find["run"].replace(' --set "builds.platform=$PLATFORM"', "")
    assert unsigned(broken) == [f"publish-arm64: pushes {pushed(images['jobs']['publish-arm64'])} unsigned"]
    # cosign signing something other than what was attested
    broken = copy.deepcopy(images)
    step = next(s for s in steps(broken["jobs"]["sign-index"]) if s.get("id") == "cosign-sign")
    step["env"]["IMAGE"] = "${{ steps.published.outputs.name }}@${{ steps.published.outputs.digest }}"
    with pytest.raises(AssertionError):
        unsigned(broken)
    # signing fewer profiles than were pushed
    broken = copy.deepcopy(images)
    broken["jobs"]["sign-index"]["strategy"]["matrix"]["include"].pop()
    assert unsigned(broken) == [f"index: pushes {pushed(images['jobs']['index'])} unsigned"]


def test_a_new_pushing_job_must_be_signed_or_explained(images):
    broken = copy.deepcopy(images)
    extra = copy.deepcopy(images["jobs"]["publish-arm64"])
    for step in steps(extra):
        if (step.get("env") or {}).get("PLATFORM"):
            step["env"]["PLATFORM"] = "linux/riscv64"
    broken["jobs"]["publish-riscv64"] = extra
    profile = "${{ matrix.profile }}"
    assert unsigned(broken) == [f"publish-riscv64: pushes ('image', 'linux/riscv64', '{profile}') unsigned"]
    quiet = copy.deepcopy(images)
    quiet["jobs"]["mirror"] = {"permissions": {"contents": "read", "packages": "write"}, "steps": []}
    assert unsigned(quiet) == ["mirror: writes packages, pushes nothing this test can read"]


def test_each_sign_job_runs_after_its_push_and_builds_nothing(images):
    jobs = images["jobs"]
    assert (jobs["sign"]["needs"], jobs["sign-arm64"]["needs"], jobs["sign-index"]["needs"]) == (
        "publish",
        "publish-arm64",
        "index",
    )
    for name in ("sign", "sign-arm64", "sign-index"):
        assert jobs[name]["if"] == jobs["publish"]["if"]
        assert not any(argv[0] == "--profile" for s in steps(jobs[name]) for argv in commands(s))
        assert "Install buildah" not in [s.get("name") for s in steps(jobs[name])]


def test_sign_summaries_say_how_to_verify_the_index_and_each_platform(images):
    jobs = images["jobs"]
    runs = {
        n: next(s for s in steps(jobs[n]) if s.get("name") == "Job summary")
        for n in jobs
        if n.startswith("sign")
    }
    assert (
        runs["sign"]["env"]["PLATFORM"] == "linux/amd64" and '--platform "$PLATFORM"' in runs["sign"]["run"]
    )
    assert runs["sign-arm64"]["env"]["PLATFORM"] == "linux/arm64"
    assert runs["sign-index"]["run"].endswith('--index >> "$GITHUB_STEP_SUMMARY"')
    for name, step in runs.items():
        assert (
            step["env"]["IMAGE"]
            == next(s for s in steps(jobs[name]) if s.get("id") == "cosign-sign")["env"]["IMAGE"]
        )


IDENTITY = "--certificate-identity-regexp '^https://github.com/Acme/builder/.github/workflows/images.yml@'"


def test_index_summary_verifies_the_index_then_the_platform_images_it_lists():
    image = "ghcr.io/acme/mtp-verl@sha256:" + "ab" * 32
    proc = run_main(
        "summary", "--profile", "mtp-detach", "--verify", image, "--signed-by", "Acme/builder", "--index"
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("### mtp-detach (multi-arch index): signed")
    assert f"cosign verify {image}" in out and out.count(IDENTITY) == 2
    assert "`docker pull ghcr.io/acme/mtp-verl:mtp-detach` resolves to" in out
    assert f"docker manifest inspect {image}" in out
    assert "cosign verify ghcr.io/acme/mtp-verl@sha256:PLATFORM_DIGEST" in out
    assert f"--digest sha256:{'ab' * 32} --signed-by Acme/builder" in out


def test_platform_summary_names_the_platform_and_pins_its_plan():
    image = "ghcr.io/acme/mtp-verl@sha256:" + "cd" * 32
    args = ["summary", "--profile", "mtp-detach", "--verify", image, "--signed-by", "Acme/builder"]
    arm = run_main(*args, "--platform", "linux/arm64")
    assert arm.returncode == 0, arm.stderr
    assert arm.stdout.startswith("### mtp-detach (linux/arm64): signed")
    assert f"cosign verify {image}" in arm.stdout and IDENTITY in arm.stdout
    assert "explain --profile mtp-detach --set builds.platform=linux/arm64 --target rl" in arm.stdout
    amd = run_main(*args, "--platform", "linux/amd64")
    assert amd.stdout.startswith("### mtp-detach (linux/amd64): signed")
    assert "--set builds.platform" not in amd.stdout  # the default platform's plan, as before
    both = run_main(*args, "--platform", "linux/arm64", "--index")
    assert both.returncode == 2 and "--index" in both.stderr and "Traceback" not in both.stderr
    other = run_main(*args, "--platform", "linux/s390x")
    assert (
        other.returncode == 2
        and "--platform: linux/s390x" in other.stderr
        and "use linux/amd64" in other.stderr
    )
