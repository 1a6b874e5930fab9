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
    path.write_text(path.read_text().replace("timeout-minutes: 240", "timeout-minutes: 5", 1))
    proc = run_main("ci", "--check", "--root", str(root), "--manifests", str(man))
    assert proc.returncode == 1 and "images.yml is stale" in proc.stderr
    (root / workflow.TESTS_WORKFLOW).unlink()
    proc = run_main("ci", "--check", "--root", str(root), "--manifests", str(man))
    assert proc.returncode == 1 and "tests.yml is stale" in proc.stderr


# -- matrix and triggers ---------------------------------------------------------------------
def test_one_matrix_entry_per_non_abstract_profile(images):
    names = manifest.load().names()
    assert "base" not in names
    for job in ("test", "publish"):
        include = images["jobs"][job]["strategy"]["matrix"]["include"]
        assert [e["profile"] for e in include] == names
        assert images["jobs"][job]["strategy"]["fail-fast"] == "false"


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
    test, publish = images["jobs"]["test"], images["jobs"]["publish"]
    assert "github.event_name == 'pull_request'" in test["if"]
    assert "pull_request" not in publish["if"] and "github.event_name == 'push'" in publish["if"]
    build = run_of(test, "Build")
    assert 'python build.py --profile "$PROFILE"' in build
    assert "--push" not in build and "--cache-to" not in build
    push = run_of(publish, "Build")
    assert '--push --registry "$registry"' in push
    assert "--summary-file" in push and "--summary-file" in build


def test_registry_cache_is_type_registry_written_only_when_publishing(images):
    for job in ("test", "publish"):
        run = run_of(images["jobs"][job], "Build")
        assert '--cache-from "type=registry,ref=$cache"' in run
        assert 'cache="$registry/mtp-verl:buildcache-$PROFILE"' in run
        assert "type=gha" not in run
    assert "type=registry,ref=$cache,mode=max" in run_of(images["jobs"]["publish"], "Build")
    buildx = next(s for s in steps(images["jobs"]["publish"]) if s.get("id") == "buildx")
    assert buildx["with"]["driver"] == "docker-container"  # the docker driver cannot export it


def test_disk_is_freed_before_checkout_and_build(images):
    for job in images["jobs"].values():
        names = [s.get("name", s.get("uses", "")) for s in steps(job)]
        assert names[0] == "Free disk space"
        cleanup = steps(job)[0]["run"]
        for path in ("/usr/share/dotnet", "/opt/ghc", "/usr/local/lib/android"):
            assert path in cleanup
        assert names.index("Free disk space") < next(i for i, n in enumerate(names) if "Build" in n)


def test_summary_step_runs_always_and_appends_to_step_summary(images):
    for job in images["jobs"].values():
        summary = next(s for s in steps(job) if s.get("name") == "Job summary")
        assert summary["if"] == "always()"
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
            assert perms["contents"] == "read"
            writes = {k for k, v in perms.items() if v == "write"}
            assert writes == (
                {"packages"} if (rel, name) == (workflow.IMAGES_WORKFLOW, "publish") else set()
            ), (rel, name, perms)


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
        "docker/setup-buildx-action",
        "docker/login-action",
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


# -- the workflow's command lines against the CLI --------------------------------------------
def build_commands(images: dict) -> dict[str, list[str]]:
    """job -> argv of the `python build.py --profile ...` line of its build step."""
    import shlex

    out = {}
    for name, job in images["jobs"].items():
        script = run_of(job, "Build").replace("\\\n", " ")
        line = next(x for x in script.splitlines() if x.strip().startswith("python build.py"))
        argv = shlex.split(line.replace("$", ""))[2:]  # drop `python build.py`; vars as words
        out[name] = argv
    return out


def test_workflow_build_commands_use_options_the_cli_accepts(images):
    """Every option the image workflow passes must exist in the main job's parser."""
    from mtpimage.cli import make_parser

    parser = make_parser()
    known = {s for a in parser._actions for s in a.option_strings}
    cmds = build_commands(images)
    used = {w for argv in cmds.values() for w in argv if w.startswith("--")}
    assert {"--profile", "--builder", "--cache-from", "--summary-file"} <= used
    assert "--push" in cmds["publish"] and "--push" not in cmds["test"]
    assert sorted(used - known) == []
    for argv in cmds.values():
        args = parser.parse_args(argv)
        assert args.profile == "PROFILE" and args.command is None


def test_ci_refuses_a_broken_profile(tmp_path):
    man = copy_manifests(tmp_path)
    (man / "profiles" / "broken.yaml").write_text(
        "schema_version: 1\nname: broken\nextends: base\nsummary: x\nmode: no-such-mode\n"
    )
    proc = run_main("ci", "--check", "--root", str(tmp_path), "--manifests", str(man))
    assert proc.returncode == 2 and "broken.yaml" in proc.stderr, proc.stderr
    assert not (tmp_path / ".github").exists()
