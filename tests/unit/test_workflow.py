"""`python build.py ci`: the generated image workflow, its freshness check, and its shape."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from mtpimage.manifests import manifest
from mtpimage.outputs import workflow

from .helpers import REPO, copy_manifests, run_main

IMAGES = REPO / workflow.IMAGES_WORKFLOW
TESTS = REPO / workflow.TESTS_WORKFLOW
SHA_USES = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def load(text: str) -> dict:
    # PyYAML reads the key `on` as True; keep it a string.
    data = yaml.load(text, Loader=yaml.BaseLoader)
    return data


def steps(job: dict) -> list[dict]:
    return job["steps"]


def run_of(job: dict, name_part: str) -> str:
    return next(s["run"] for s in steps(job) if name_part in s.get("name", ""))


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return workflow.render_workflows(manifest.load())


@pytest.fixture(scope="module")
def images(generated) -> dict:
    return load(generated[workflow.IMAGES_WORKFLOW])


@pytest.fixture
def repo_copy(tmp_path):
    """A scratch 'repository': manifests and the committed workflows."""
    man = copy_manifests(tmp_path)
    (tmp_path / ".github").mkdir()
    shutil.copytree(REPO / ".github" / "workflows", tmp_path / ".github" / "workflows")
    return tmp_path, man


# -- freshness --------------------------------------------------------------------------------
def test_ci_check_passes_on_the_repository():
    proc = run_main("ci", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


def test_committed_workflows_equal_generation(generated):
    assert IMAGES.read_text() == generated[workflow.IMAGES_WORKFLOW]
    assert TESTS.read_text() == generated[workflow.TESTS_WORKFLOW]


def test_generation_is_byte_identical_across_runs(generated):
    again = workflow.render_workflows(manifest.load())
    assert again == generated


def test_check_names_the_stale_file_and_exits_1(repo_copy):
    root, man = repo_copy
    (man / "profiles" / "mtp-extra.yaml").write_text(
        "schema_version: 1\nname: mtp-extra\nextends: mtp-detach\nsummary: one more image\n"
        "engine:\n  context_parallel_size: 4\n"
    )
    proc = run_main("ci", "--check", "--root", str(root), "--manifests", str(man))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ".github/workflows/images.yml is stale" in proc.stderr
    assert "tests.yml" not in proc.stderr  # unaffected by profiles
    assert "+          - profile: mtp-extra" in proc.stdout  # the diff shows why
    assert "python build.py ci" in proc.stderr  # and the fix
    # Regenerating fixes it; a second run changes nothing.
    assert run_main("ci", "--root", str(root), "--manifests", str(man)).returncode == 0
    again = run_main("ci", "--root", str(root), "--manifests", str(man))
    assert "unchanged .github/workflows/images.yml" in again.stdout
    assert run_main("ci", "--check", "--root", str(root), "--manifests", str(man)).returncode == 0
    data = load((root / workflow.IMAGES_WORKFLOW).read_text())
    assert {"profile": "mtp-extra"} in data["jobs"]["publish"]["strategy"]["matrix"]["include"]


def test_check_fails_when_workflow_is_missing_or_hand_edited(repo_copy):
    root, man = repo_copy
    path = root / workflow.IMAGES_WORKFLOW
    path.write_text(path.read_text().replace("timeout-minutes: 120", "timeout-minutes: 5", 1))
    proc = run_main("ci", "--check", "--root", str(root), "--manifests", str(man))
    assert proc.returncode == 1 and "images.yml is stale" in proc.stderr
    (root / workflow.TESTS_WORKFLOW).unlink()
    proc = run_main("ci", "--check", "--root", str(root), "--manifests", str(man))
    assert proc.returncode == 1 and "tests.yml is stale" in proc.stderr


# -- matrix and triggers ---------------------------------------------------------------------
def test_one_matrix_entry_per_non_abstract_profile(images):
    names = manifest.load().names()
    assert "base" not in names
    for job in ("publish", "sign"):
        include = images["jobs"][job]["strategy"]["matrix"]["include"]
        assert [e["profile"] for e in include] == names
        assert images["jobs"][job]["strategy"]["fail-fast"] == "false"
    # the pull-request job builds them all, in turn, on one runner
    assert images["jobs"]["test"]["steps"][-2]["env"]["PROFILES"] == " ".join(names)
    assert "strategy" not in images["jobs"]["stack"]  # the stack: once for all profiles


def test_abstract_profile_gets_no_matrix_entry(tmp_path):
    man = copy_manifests(tmp_path)
    (man / "profiles" / "shared.yaml").write_text(
        "schema_version: 1\nname: shared\nextends: base\nabstract: true\nsummary: a parent\n"
    )
    entries = workflow.image_profiles(manifest.load(man))
    assert "shared" not in [e["name"] for e in entries]
    assert len(entries) == len(manifest.load().names())


def test_triggers_push_main_tags_and_pull_requests(images):
    on = images["on"]
    assert on["push"]["branches"] == ["main"] and on["push"]["tags"] == ["**"]
    assert on["pull_request"]["branches"] == ["main"]
    assert "manifests/**" in on["push"]["paths"] and "manifests/**" in on["pull_request"]["paths"]
    assert "pull_request_target" not in on


def test_pull_requests_build_and_test_without_pushing(images):
    jobs = images["jobs"]
    assert "github.event_name == 'pull_request'" in jobs["test"]["if"]
    for name in ("stack", "publish", "sign"):
        assert "pull_request" not in jobs[name]["if"] and "github.event_name == 'push'" in jobs[name]["if"]
    build = run_of(jobs["test"], "Build")
    assert 'python build.py --profile "$profile"' in build
    assert "--push" not in build and "--cache-to" not in build
    push = run_of(jobs["publish"], "Build")
    assert '--push --registry "$registry"' in push
    assert "--summary-file" in push and "--summary-file" in build


def test_the_job_graph_is_stack_then_publish_then_sign(images):
    jobs = images["jobs"]
    assert "needs" not in jobs["stack"] and "needs" not in jobs["test"]
    assert jobs["publish"]["needs"] == "stack" and jobs["sign"]["needs"] == "publish"
    stack = run_of(jobs["stack"], "stack")
    assert 'python build.py stack --push --registry "$registry"' in stack
    assert 'export MTP_WHEEL_CACHE_REPO="$registry/mtp-ext-wheels"' in stack  # wheels shared
    assert "--profile" not in stack  # every profile: each distinct stack once


def test_pull_requests_take_their_layers_from_the_pushed_stack(images):
    run = run_of(images["jobs"]["test"], "Build")
    assert "mapfile -t cache < <(python build.py stack --cache-from-args --profile" in run
    assert '"${cache[@]}"' in run
    assert "buildcache" not in run and "type=gha" not in run and "--builder" not in run
    assert "--engine" not in run  # docker's BuildKit: fast, cached, never published
    # the docker driver: the image is built into the runner's docker, tested there, no --load
    for job in images["jobs"].values():
        assert not any(s.get("uses", "").startswith("docker/setup-buildx-action@") for s in steps(job))


def test_publish_builds_reproducibly_and_pushes_gzip_made_by_the_tool(images):
    """#48: what users pull is the reproducible engine's image: buildah on a clean builder
    (--no-cache: no layer cache, local or a registry's), its layers gzip-compressed by the tool."""
    from mtpimage.engine import layercompress

    run = run_of(images["jobs"]["publish"], "Build")
    main = next(
        argv
        for argv in build_commands({"jobs": {"publish": images["jobs"]["publish"]}})
        if argv[0] == "--profile"
    )
    assert main[main.index("--engine") + 1] == "buildah"
    assert (
        main[main.index("--compression") + 1]
        == "gzip"
        == workflow.ci_settings()["jobs"]["publish"]["compression"]
    )
    assert layercompress.named("gzip").name == "gzip"  # a format compression.yaml has
    assert "--push" in main and main[main.index("--registry") + 1] == "registry"
    assert "--no-cache" in main
    for refused in ("--cache-from", "--cache-to", "--builder", "cache-from-args"):
        assert refused not in run, refused
    # the compiled extensions' wheels from the share the stack job fills: installed by sha256,
    # not compiled again (a compile would not give the same .so)
    assert 'export MTP_WHEEL_CACHE_REPO="$registry/mtp-ext-wheels"' in run
    assert images["jobs"]["publish"]["needs"] == "stack"


def test_publish_runs_the_build_as_root_keeping_path_home_and_environment(images):
    run = run_of(images["jobs"]["publish"], "Build").replace("\\\n", " ")
    line = " ".join(next(x for x in run.splitlines() if "build.py --profile" in x).split())
    assert line.startswith('sudo -E env "PATH=$PATH" "HOME=$HOME" python build.py --profile')


def test_publish_installs_buildah_and_checks_the_reproducible_disk_first(images):
    job = images["jobs"]["publish"]
    names = [s.get("name", s.get("uses", "")) for s in steps(job)]
    install = run_of(job, "Install buildah")
    assert "sudo apt-get install -y -q --no-install-recommends buildah" in install
    assert "buildah --version" in install  # the version a verifier needs, in the log
    assert (
        names.index("Install buildah")
        < names.index("Check the free disk")
        < names.index("Build reproducibly, test and push")
    )
    assert run_of(job, "Check the free disk").endswith("--engine buildah")
    # the pull requests' job needs no buildah
    assert "Install buildah" not in [s.get("name") for s in steps(images["jobs"]["test"])]


def test_publish_summary_says_how_to_verify_the_image(images):
    run = run_of(images["jobs"]["publish"], "Job summary")
    assert "--reproducible" in run and 'export MTP_WHEEL_CACHE_REPO="$registry/mtp-ext-wheels"' in run
    assert "sudo" not in run  # it reads; the runner's user can


def test_stack_runner_is_an_input_or_variable_with_a_hosted_default(images):
    runs_on = images["jobs"]["stack"]["runs-on"]
    assert runs_on == "${{ inputs.stack-runner || vars.MTP_STACK_RUNNER || 'ubuntu-24.04' }}"
    assert "stack-runner" in images["on"]["workflow_dispatch"]["inputs"]
    for name in ("test", "sign"):
        assert images["jobs"][name]["runs-on"] == "ubuntu-24.04"
    # the reproducible build needs more disk than the hosted runner may have: a variable names a larger one
    assert images["jobs"]["publish"]["runs-on"] == "${{ vars.MTP_PUBLISH_RUNNER || 'ubuntu-24.04' }}"


def test_every_building_job_checks_its_measured_disk_need_first(images):
    need = workflow.ci_settings()["jobs"]
    for name in ("test", "stack", "publish"):
        job = images["jobs"][name]
        names = [s.get("name", s.get("uses", "")) for s in steps(job)]
        check = next(s for s in steps(job) if s.get("name") == "Check the free disk")
        engine = " --engine buildah" if name == "publish" else ""
        assert check["run"] == f'python build.py disk --job {name} --need-gb "$DISK_NEED_GB"{engine}'
        assert float(check["env"]["DISK_NEED_GB"]) == need[name]["disk_need_gb"] > 0
        first_build = next(i for i, n in enumerate(names) if n.startswith("Build"))
        assert names.index("Check the free disk") < first_build
        assert int(job["timeout-minutes"]) == need[name]["timeout_minutes"]


def test_disk_is_freed_before_checkout_and_build(images):
    for name in ("test", "stack", "publish"):
        job = images["jobs"][name]
        names = [s.get("name", s.get("uses", "")) for s in steps(job)]
        assert names[0] == "Free disk space" and steps(job)[0]["id"] == "free-disk"
        cleanup = steps(job)[0]["run"]
        for path in ("/usr/share/dotnet", "/opt/ghc", "/usr/local/lib/android"):
            assert path in cleanup


def test_sign_job_attests_and_signs_the_published_digest(images):
    sign = images["jobs"]["sign"]
    published = next(s for s in steps(sign) if s.get("id") == "published")
    assert (
        'python build.py published --profile "$PROFILE" --registry "$registry" >> "$GITHUB_OUTPUT"'
        in (published["run"])
    )
    attest = next(s for s in steps(sign) if s.get("uses", "").startswith("actions/attest-build-provenance@"))
    assert attest["with"] == {
        "subject-name": "${{ steps.published.outputs.name }}",
        "subject-digest": "${{ steps.published.outputs.digest }}",
        "push-to-registry": "true",
    }
    cosign = next(s for s in steps(sign) if s.get("id") == "cosign-sign")
    assert 'cosign sign --yes "$IMAGE"' in cosign["run"]
    assert (
        cosign["env"]["IMAGE"] == "${{ steps.published.outputs.name }}@${{ steps.published.outputs.digest }}"
    )
    names = [s.get("uses", s.get("name", "")) for s in steps(sign)]
    installer = next(i for i, n in enumerate(names) if n.startswith("sigstore/cosign-installer@"))
    assert installer < names.index("Sign the image and its SBOM (keyless)")
    assert "--verify" in run_of(sign, "Job summary")


def test_runner_only_steps_are_exactly_the_named_ones(generated):
    """The rehearsal leaves out only these run steps; a new one must be rehearsed or named."""
    ids = {
        s["id"]
        for job in load(generated[workflow.IMAGES_WORKFLOW])["jobs"].values()
        for s in steps(job)
        if "run" in s and s.get("id") in workflow.RUNNER_ONLY_STEPS
    }
    assert ids == set(workflow.RUNNER_ONLY_STEPS)


def test_summary_step_runs_always_and_appends_to_step_summary(images):
    for name, job in images["jobs"].items():
        if name in ("stack", "index"):  # the index step tees its own lines into the summary
            continue
        summary = next(s for s in steps(job) if s.get("name") == "Job summary")
        assert summary.get("if") == "always()" or name.startswith("sign")
        assert '>> "$GITHUB_STEP_SUMMARY"' in summary["run"]
        assert "python build.py summary" in summary["run"]


def test_concurrency_cancels_only_pull_request_runs(images):
    conc = images["concurrency"]
    assert "github.ref" in conc["group"] and "github.workflow" in conc["group"]
    assert "pull_request" in conc["cancel-in-progress"]


# -- least privilege and supply chain --------------------------------------------------------
def test_permissions_are_least_privilege(generated):
    for rel, text in generated.items():
        data = load(text)
        assert data["permissions"] == {} or data["permissions"] == "{}", rel
        for name, job in data["jobs"].items():
            perms = job["permissions"]
            writes = {k for k, v in perms.items() if v == "write"}
            expected = {
                (workflow.IMAGES_WORKFLOW, "stack"): {"packages"},
                (workflow.IMAGES_WORKFLOW, "publish"): {"packages"},
                (workflow.IMAGES_WORKFLOW, "publish-arm64"): {"packages"},
                (workflow.IMAGES_WORKFLOW, "index"): {"packages"},
                # OIDC only where it signs, and that job runs no build
                (workflow.IMAGES_WORKFLOW, "sign"): {"packages", "id-token", "attestations"},
                (workflow.IMAGES_WORKFLOW, "sign-arm64"): {"packages", "id-token", "attestations"},
                (workflow.IMAGES_WORKFLOW, "sign-index"): {"packages", "id-token", "attestations"},
                # the weekly bump pushes its branch and opens the pull request, nothing else
                (workflow.BUMP_WORKFLOW, "bump"): {"contents", "pull-requests"},
            }.get((rel, name), set())
            assert perms["contents"] == ("write" if "contents" in expected else "read"), (rel, name)
            assert writes == expected, (rel, name, perms)


def test_actions_are_pinned_by_full_sha_with_version_comment(generated):
    pins = workflow.load_actions()
    seen = set()
    for text in generated.values():
        for line in text.splitlines():
            m = re.match(r"^\s*(?:- )?uses: (\S+)(?: # (\S+))?$", line)
            if not m:
                continue
            uses, version = m.groups()
            assert SHA_USES.match(uses), line
            pin = next(p for p in pins.values() if uses == f"{p['uses']}@{p['sha']}")
            assert version == pin["version"], line
            seen.add(pin["uses"])
    assert seen == {
        "actions/checkout",
        "actions/setup-python",
        "docker/login-action",
        "actions/attest-build-provenance",
        "sigstore/cosign-installer",
    }


def test_checkout_never_persists_credentials(generated):
    for text in generated.values():
        for job in load(text)["jobs"].values():
            for step in steps(job):
                if step.get("uses", "").startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] == "false"


def test_no_expression_inside_run_scripts(generated):
    """Values reach scripts through env (zizmor: template-injection)."""
    for text in generated.values():
        for job in load(text)["jobs"].values():
            for step in steps(job):
                assert "${{" not in step.get("run", ""), step


def test_actions_table_rejects_a_short_sha(tmp_path):
    bad = tmp_path / "actions.yaml"
    bad.write_text("checkout: {uses: actions/checkout, sha: 3d3c42e, version: v7.0.1}\n")
    with pytest.raises(Exception, match="40-hex"):
        workflow.load_actions(bad)


# -- registry --------------------------------------------------------------------------------
def test_default_registry_is_ghcr_of_the_lowercased_owner(images, generated):
    text = generated[workflow.IMAGES_WORKFLOW]
    assert "# registry: ghcr.io/{owner}" in text
    publish = images["jobs"]["publish"]
    build = next(s for s in steps(publish) if "Build" in s.get("name", ""))
    assert build["env"]["OWNER"] == "${{ github.repository_owner }}"
    assert 'registry="ghcr.io/${OWNER,,}"' in build["run"]
    login = next(s for s in steps(publish) if s.get("uses", "").startswith("docker/login-action@"))
    assert login["with"] == {
        "registry": "ghcr.io",
        "username": "${{ github.actor }}",
        "password": "${{ secrets.GITHUB_TOKEN }}",
    }


def test_custom_registry_is_baked_in_and_kept(repo_copy):
    root, man = repo_copy
    reg = "registry.example.com:5000/ml-team"
    proc = run_main("ci", "--root", str(root), "--manifests", str(man), "--registry", reg)
    assert proc.returncode == 0, proc.stderr
    text = (root / workflow.IMAGES_WORKFLOW).read_text()
    assert f"# registry: {reg}" in text
    assert f"# Regenerate: python build.py ci --registry {reg}" in text
    data = load(text)
    publish = data["jobs"]["publish"]
    assert f'registry="{reg}"' in run_of(publish, "Build")
    assert "OWNER" not in next(s for s in steps(publish) if "Build" in s.get("name", ""))["env"]
    login = next(s for s in steps(publish) if s.get("uses", "").startswith("docker/login-action@"))
    assert login["with"]["registry"] == "registry.example.com:5000"
    assert login["with"]["password"] == "${{ secrets.REGISTRY_PASSWORD }}"
    # Pull requests of forks get no secrets: the test job does not log in to it.
    assert not any(s.get("uses", "").startswith("docker/login-action@") for s in steps(data["jobs"]["test"]))
    assert "packages" not in data["jobs"]["test"]["permissions"]
    # Without --registry, `ci` and `ci --check` keep the committed registry.
    assert run_main("ci", "--check", "--root", str(root), "--manifests", str(man)).returncode == 0
    run_main("ci", "--root", str(root), "--manifests", str(man))
    assert (root / workflow.IMAGES_WORKFLOW).read_text() == text


@pytest.mark.parametrize(
    "bad",
    [
        "ghcr.io",
        "GHCR.io/Owner",
        "ghcr.io/${{ github.actor }}",
        "ghcr.io/ns; rm -rf /",
        "https://ghcr.io/ns",
        "ghcr.io/ns/",
    ],
)
def test_bad_registry_is_one_line_input_error(bad, tmp_path):
    proc = run_main("ci", "--check", "--root", str(tmp_path), "--registry", bad)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "HOST[:PORT]/NAMESPACE" in proc.stderr
    assert not (tmp_path / ".github").exists()


@pytest.mark.parametrize(
    "good", ["ghcr.io/{owner}", "localhost:5000/mtp", "ghcr.io/my-org/sub_team", "nvcr.io/{owner}/images"]
)
def test_good_registries_parse(good):
    reg = workflow.parse_registry(good)
    assert str(reg) == good and "/" not in reg.host


# -- tests.yml -------------------------------------------------------------------------------
def test_tests_workflow_runs_the_readme_test_command_as_root(generated):
    data = load(generated[workflow.TESTS_WORKFLOW])
    job = data["jobs"]["test"]
    assert job["runs-on"].startswith("ubuntu-")
    runs = [s["run"] for s in steps(job) if "run" in s]
    assert runs == ['sudo env "PATH=$PATH" CI=true bash scripts/test.sh']
    assert "scripts/test.sh" in (REPO / "README.md").read_text()
    assert (REPO / "scripts" / "test.sh").is_file()
    assert data["on"]["pull_request"] in ("", None, {})


def test_generated_files_have_regenerate_header_and_no_machine_paths(generated):
    for text in generated.values():
        head = text.splitlines()[:4]
        assert head[0].startswith("# GENERATED by `python build.py ci`")
        assert any(line.startswith("# Regenerate: python build.py ci") for line in head)
        for needle in (str(REPO), "/root/", "/home/", "/tmp/"):
            assert needle not in text


# -- job summary -----------------------------------------------------------------------------
DIGEST = "sha256:" + "ab" * 32


def test_summary_of_a_pushed_image_lists_digest_and_pull_strings():
    md = workflow.render_summary(
        "mtp-detach",
        {
            "profile": "mtp-detach",
            "image": "mtp-verl:mtp-detach-0123456789ab",
            "pushed": True,
            "references": ["ghcr.io/acme/mtp-verl:mtp-detach-0123456789ab"],
            "digest": DIGEST,
        },
    )
    assert md.startswith("### mtp-detach\n")
    assert f"`docker pull ghcr.io/acme/mtp-verl@{DIGEST}`" in md
    assert f"`srun --container-image=ghcr.io#acme/mtp-verl@{DIGEST}`" in md
    assert f"`apptainer pull docker://ghcr.io/acme/mtp-verl@{DIGEST}`" in md
    assert f"| digest | `{DIGEST}` |" in md


def test_summary_of_a_zstd_image_says_which_clients_read_it_and_of_a_gzip_one_nothing():
    zstd = workflow.render_summary("mtp-detach", {**PUSHED, "layer_format": "zstd"})
    pull = f"`docker pull ghcr.io/acme/mtp-verl@{DIGEST}`"
    assert f"| docker | {pull} (needs docker 23.0.0 or later (zstd layers)) |" in zstd
    assert "(needs enroot 4.0.0 or later (zstd layers))" in zstd
    assert "(needs Apptainer 1.4.0 or later (zstd layers))" in zstd
    gzip = workflow.render_summary("mtp-detach", {**PUSHED, "layer_format": "gzip"})
    assert f"| docker | {pull} |" in gzip and "needs" not in gzip


def test_pull_strings_handle_a_registry_port():
    s = workflow.pull_strings("localhost:5000/ml/mtp-verl:tag-1", DIGEST)
    assert s["docker"] == f"docker pull localhost:5000/ml/mtp-verl@{DIGEST}"
    assert s["pyxis"] == f"srun --container-image=localhost:5000#ml/mtp-verl@{DIGEST}"


def test_summary_of_a_pull_request_build_says_not_pushed():
    md = workflow.render_summary("mtp-full", {"profile": "mtp-full", "image": "mtp-verl:x", "pushed": False})
    assert "no (pull request" in md and "docker pull" not in md and "`mtp-verl:x`" in md


def test_summary_command_never_fails_the_job(tmp_path):
    proc = run_main("summary", "--profile", "mtp-full", str(tmp_path / "missing.json"))
    assert proc.returncode == 0 and "### mtp-full" in proc.stdout
    assert "stopped before writing" in proc.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = run_main("summary", "--profile", "mtp-full", str(bad))
    assert proc.returncode == 0 and "unreadable" in proc.stdout
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {"profile": "mtp-full", "pushed": True, "digest": DIGEST, "references": ["ghcr.io/a/mtp-verl:t"]}
        )
    )
    proc = run_main("summary", "--profile", "mtp-full", str(good))
    assert f"docker pull ghcr.io/a/mtp-verl@{DIGEST}" in proc.stdout


PUSHED = {
    "profile": "mtp-detach",
    "image": "mtp-verl:mtp-detach-0123456789ab",
    "pushed": True,
    "references": ["ghcr.io/acme/mtp-verl:mtp-detach-0123456789ab", "ghcr.io/acme/mtp-verl:mtp-detach"],
    "digest": DIGEST,
}
REV = "0123456789abcdef0123456789abcdef01234567"


def test_publish_summary_of_a_reproducible_image_says_how_to_verify_it():
    from mtpimage.outputs import reproduce

    labels = {
        reproduce.REVISION_LABEL: REV,
        reproduce.SOURCE_LABEL: "https://github.com/acme/mtp-image-builder",
    }
    seen = []
    how = reproduce.for_published(
        "mtp-detach",
        PUSHED,
        lambda ref: seen.append(ref) or labels,
        "ghcr.io/acme/mtp-ext-wheels",
        "buildah 1.33.7 on Ubuntu 24.04.2 LTS",
    )
    assert seen == [PUSHED["image"]]  # the labels of the image this job built and pushed
    md = workflow.render_summary("mtp-detach", PUSHED, reproduce=how)
    block = md.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block == [
        "git clone https://github.com/acme/mtp-image-builder mtp-image-builder",
        "cd mtp-image-builder",
        f"git checkout {REV}",
        "export MTP_WHEEL_CACHE_REPO=ghcr.io/acme/mtp-ext-wheels",
        f"python3 build.py verify --profile mtp-detach --image ghcr.io/acme/mtp-verl@{DIGEST}",
    ]
    assert "by buildah 1.33.7 on Ubuntu 24.04.2 LTS" in md
    assert md.index("| digest |") < md.index("#### Verify it")  # after the table


def test_publish_summary_without_labels_says_how_to_read_the_revision():
    from mtpimage.errors import EnvironmentProblem
    from mtpimage.outputs import reproduce

    def unreadable(ref):
        raise EnvironmentProblem("docker image inspect failed")

    how = reproduce.for_published("mtp-detach", PUSHED, unreadable, None, None)
    md = workflow.render_summary("mtp-detach", PUSHED, reproduce=how)
    image = f"ghcr.io/acme/mtp-verl@{DIGEST}"
    assert reproduce.label_command(image) in md and "git checkout REVISION" in md
    assert "git clone https://github.com/OWNER/REPO mtp-image-builder" in md
    assert "MTP_WHEEL_CACHE_REPO" not in md and "Built reproducibly:" in md


def test_no_verify_section_for_what_was_not_pushed():
    from mtpimage.outputs import reproduce

    for data in ({**PUSHED, "pushed": False}, {**PUSHED, "digest": None}, {"profile": "x"}):
        assert reproduce.for_published("mtp-detach", data, lambda ref: {}, None, None) is None


def test_summary_reproducible_never_fails_the_job(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({**PUSHED, "image": "mtp-verl:no-such-image-here-48w"}))
    proc = run_main(
        "summary", "--profile", "mtp-detach", str(good), "--reproducible",
        env={"MTP_WHEEL_CACHE_REPO": "ghcr.io/acme/mtp-ext-wheels"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        f"python3 build.py verify --profile mtp-detach --image ghcr.io/acme/mtp-verl@{DIGEST}" in proc.stdout
    )
    assert "export MTP_WHEEL_CACHE_REPO=ghcr.io/acme/mtp-ext-wheels" in proc.stdout
    assert "git checkout REVISION" in proc.stdout  # no such local image: the label is unread
    missing = run_main("summary", "--profile", "mtp-detach", str(tmp_path / "gone.json"), "--reproducible")
    assert missing.returncode == 0 and "Verify it" not in missing.stdout


# -- the workflow's command lines against the CLI --------------------------------------------
def build_commands(images: dict) -> list[list[str]]:
    """argv (without `python build.py`) of every `python build.py ...` line of every run step."""
    import shlex

    out = []
    for job in images["jobs"].values():
        for step in steps(job):
            script = step.get("run", "").replace("\\\n", " ")
            for line in script.splitlines():
                line = (
                    line.strip()
                    .removeprefix("mapfile -t cache < <(")
                    .split(" >> ")[0]
                    .split(" | ")[0]
                    .rstrip(")")
                )
                line = re.sub(r'^sudo -E env (?:"\w+=\$\w+" )+\s*', "", line)  # as root, same argv
                if line.startswith("python build.py"):
                    line = line.replace("$DISK_NEED_GB", "1").replace('"${cache[@]}"', "")
                    out.append(shlex.split(line.replace("$", ""))[2:])
    return out


def test_workflow_build_commands_use_options_the_cli_accepts(images):
    """Every command and option the image workflow runs must exist in the CLI's parser."""
    from mtpimage.cli import make_parser

    parser = make_parser()
    cmds = build_commands(images)
    firsts = {argv[0] for argv in cmds}
    assert {"--profile", "stack", "disk", "published", "summary", "index"} <= firsts
    for argv in cmds:
        args = parser.parse_args(argv)  # exits (SystemExit) on an unknown option
        assert args is not None
    main = [a for a in cmds if a[0] == "--profile"]
    assert any("--push" in a for a in main) and any("--push" not in a for a in main)


def test_ci_refuses_a_broken_profile(tmp_path):
    man = copy_manifests(tmp_path)
    (man / "profiles" / "broken.yaml").write_text(
        "schema_version: 1\nname: broken\nextends: base\nsummary: x\nmode: no-such-mode\n"
    )
    proc = run_main("ci", "--check", "--root", str(tmp_path), "--manifests", str(man))
    assert proc.returncode == 2 and "broken.yaml" in proc.stderr, proc.stderr
    assert not (tmp_path / ".github").exists()


def test_bump_workflow_runs_the_bump_of_each_component_weekly_and_opens_a_pull_request(generated):
    """#36: a scheduled job runs `bump` for the components of ci.yaml and opens a pull request
    with its report (it cannot run here: it needs GitHub; actionlint and zizmor check it)."""
    from mtpimage.cli import make_parser

    data = load(generated[workflow.BUMP_WORKFLOW])
    on = data.get("on") or data.get(True)
    ci = workflow.ci_settings()["bump"]
    assert on["schedule"] == [{"cron": ci["cron"]}] and "workflow_dispatch" in on
    listing = steps(data["jobs"]["plan"])[0]
    assert listing["env"]["DEFAULT"] == " ".join(ci["components"])
    bump = {s.get("id", s.get("name")): s for s in steps(data["jobs"]["bump"])}
    line = next(x for x in bump["bump"]["run"].splitlines() if "build.py bump" in x)
    argv = line.split("build.py", 1)[1].replace('"$COMPONENT"', "verl").split()
    args = make_parser().parse_args(argv)
    assert (args.component, args.latest, str(args.report)) == ("verl", True, "bump.md")
    pr = bump["Open or update the pull request"]
    assert "gh pr create" in pr["run"] and "--body-file bump.md" in pr["run"]
    assert pr["if"] == "steps.bump.outputs.moved == 'true'"


def test_the_builder_is_named_by_buildahs_version_or_not_at_all():
    from mtpimage.errors import EnvironmentProblem
    from mtpimage.outputs import reproduce

    said = reproduce.describe_builder(lambda: "/usr/bin/buildah (buildah 1.33.7, reproducible: bud ...)")
    assert said.startswith("buildah 1.33.7")
    assert reproduce.describe_builder(lambda: "something else").startswith("something else")

    def missing():
        raise EnvironmentProblem("buildah not found")

    assert reproduce.describe_builder(missing) is None


# -- issue 49: linux/arm64 on a native runner, one multi-arch index --------------------------
def test_arm64_publish_job_builds_natively_and_the_index_job_lists_both(images):
    jobs = images["jobs"]
    ci = workflow.ci_settings()["jobs"]
    arm = jobs["publish-arm64"]
    # a native arm64 runner (GitHub's), overridable by a repository variable
    assert arm["runs-on"] == "${{ vars.MTP_PUBLISH_ARM64_RUNNER || 'ubuntu-24.04-arm' }}"
    assert str(arm["timeout-minutes"]) == str(ci["publish-arm64"]["timeout_minutes"])
    assert arm["strategy"] == jobs["publish"]["strategy"]  # every profile, as publish
    build = run_of(arm, "Build").replace("\\\n", " ")
    assert '--set "builds.platform=$PLATFORM"' in build and "--engine buildah --no-cache" in build
    assert "--push" in build and "qemu" not in build
    step = next(s for s in arm["steps"] if s.get("name", "").startswith("Build"))
    assert step["env"]["PLATFORM"] == "linux/arm64"
    assert '--platform "$PLATFORM"' in run_of(arm, "Job summary")
    index = jobs["index"]
    assert index["needs"] == ["publish", "publish-arm64"]
    assert index["if"] == jobs["publish"]["if"]
    run = run_of(index, "multi-arch index")
    assert 'python build.py index --profile "$PROFILE"' in run
    assert "--platform linux/amd64" in run and '--platform "linux/arm64"' in run
