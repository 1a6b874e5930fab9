"""Generate the GitHub Actions workflows from the profiles (`python3 build.py ci`).

`.github/workflows/images.yml` gets one matrix entry per image (each non-abstract
profile); `.github/workflows/tests.yml` runs the README's test command. Both come from
jinja templates in mtpimage/templates/workflows/ and share one table of third-party
actions pinned by commit SHA (actions.yaml there). The output is a pure function of the
profile names, the templates, the pins and the registry: no clock, no host facts, so an
unchanged repository regenerates byte-identical files and `ci --check` can compare.

The image workflow's jobs (their runners, time limits, measured disk needs and the published
compression are data: mtpimage/data/ci.yaml): `stack` (build.py stack: the shared layers once,
the compiled wheels into the share; the pull requests' cache), `publish` per profile (the main
job with --engine buildah, as root: what users pull is built bit for bit on a clean builder and
pushed with the tool's gzip; --summary-file, and a summary that says how to verify it),
`publish-arm64` per profile (the same for linux/arm64 on a native arm64 runner), `index` per
profile (one multi-arch index under the profile's tag; its digest a job output), one sign job
after each of the three (`sign`, `sign-arm64`, `sign-index`: attestation and cosign of the digest
that job pushed, and a summary that says how to verify it), and for pull requests `test` (every
profile in turn with docker's BuildKit and the stack as cache, no push).
tests/unit/test_workflow.py checks each option against the CLI parser;
tests/e2e/test_workflow_rehearsal.py runs the run steps.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import yaml

from mtpimage import locations
from mtpimage.errors import InputError
from mtpimage.imageref import OWNER, ImageRef, Registry
from mtpimage.manifests.manifest import Manifests, resolve_profile
from mtpimage.outputs.reproduce import Reproduce
from mtpimage.outputs.reproduce import markdown as reproduce_markdown
from mtpimage.outputs.signature import verify_commands
from mtpimage.plan.model import IMAGE_REPOSITORY, build_plan
from mtpimage.publish import pullneeds
from mtpimage.publish.baseplatform import BUILD_PLATFORM

REPO_ROOT = locations.PACKAGE.parent
TEMPLATES = locations.PACKAGE / "templates" / "workflows"
IMAGES_WORKFLOW = ".github/workflows/images.yml"
TESTS_WORKFLOW = ".github/workflows/tests.yml"
BUMP_WORKFLOW = ".github/workflows/bump.yml"

# OWNER ("{owner}") is replaced at run time by the lower-cased repository owner.
DEFAULT_REGISTRY = f"ghcr.io/{OWNER}"
RUNNER_PYTHON = "3.12"
WHEEL_REPOSITORY = "mtp-ext-wheels"  # REG/mtp-ext-wheels:<key>: the extension wheels' share
# Run steps that only make sense on a GitHub runner; the rehearsal leaves out these (and
# every `uses:` step) and runs every other run step, in order.
RUNNER_ONLY_STEPS = {
    "free-disk": "deletes the runner's preinstalled SDKs and prunes every docker image",
    "cosign-sign": "keyless signing needs the workflow's OIDC token and Sigstore",
}
# Preinstalled SDKs on GitHub's Ubuntu runners that a CUDA image build does not need (~30 GB).
CLEANUP_PATHS = (
    "/usr/share/dotnet",
    "/opt/ghc",
    "/usr/local/.ghcup",
    "/usr/local/lib/android",
    "/opt/hostedtoolcache/CodeQL",
    "/usr/local/share/boost",
    "/usr/share/swift",
)
# A push or pull request touching one of these rebuilds the images (tags always do).
TRIGGER_PATHS = ("manifests/**", "images/**", "mtpimage/**", "build.py", "requirements.txt", IMAGES_WORKFLOW)

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
HEADER_REGISTRY_RE = re.compile(r"^# registry: (\S+)$", re.M)


def parse_registry(value: str) -> Registry:
    """The registry model's HOST[:PORT]/NAMESPACE, held stricter here because it is baked
    into a workflow: a namespace is required (`{owner}` allowed), all in lower case (GHCR
    refuses upper case), no trailing slash."""
    fail = InputError(
        "--registry",
        value,
        "expected HOST[:PORT]/NAMESPACE in lower case (the namespace may be "
        f"'{OWNER}' for the repository owner)",
        f"for example --registry {DEFAULT_REGISTRY} or --registry registry.example.com:5000/ml",
    )
    try:
        reg = Registry.parse(value, owner_placeholder=True)
    except InputError:
        raise fail from None
    if not reg.namespace or str(reg) != value or value != value.lower():
        raise fail
    return reg


def needs_owner(registry: Registry) -> bool:
    return OWNER in registry.namespace


def shell_word(registry: Registry) -> str:
    """The registry as a bash double-quoted word; the owner comes from $OWNER, lower-cased
    (GHCR refuses upper case; `${{ github.repository_owner }}` keeps the account's case)."""
    return str(registry).replace(OWNER, "${OWNER,,}")


def load_actions(path: Path | None = None) -> dict[str, dict]:
    """The pinned actions table; each entry gains `ref`: `owner/name@SHA # version`."""
    path = path or TEMPLATES / "actions.yaml"
    data = yaml.safe_load(path.read_text())
    out = {}
    for key, entry in sorted(data.items()):
        sha, uses, version = entry.get("sha", ""), entry.get("uses", ""), entry.get("version", "")
        if not SHA_RE.match(str(sha)):
            raise InputError(
                str(path.name),
                f"{key}.sha",
                f"{sha!r} is not a full 40-hex commit SHA",
                "pin every action by its full commit SHA",
            )
        if not re.match(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", str(uses)) or not version:
            raise InputError(str(path.name), key, "needs `uses: owner/name` and `version: vX.Y.Z`")
        out[key] = {**entry, "ref": f"{uses}@{sha} # {version}"}
    return out


def ci_settings() -> dict:
    """mtpimage/data/ci.yaml: the jobs' time limits and disk needs, the runners."""
    from importlib import resources

    return yaml.safe_load(resources.files("mtpimage.data").joinpath("ci.yaml").read_text())


def image_profiles(m: Manifests) -> list[dict]:
    """One entry per image: each non-abstract profile, in name order. (The profile name is
    part of the Plan and so of the image identity: no two profiles share an image.) Each
    profile is resolved, so `ci` refuses a broken profile instead of generating a job for it."""
    out = []
    for name in m.names():
        plan = build_plan(m, resolve_profile(m, name))
        out.append({"name": name, "mode": plan.mode, "experimental": plan.experimental})
    return out


def regenerate_command(registry: Registry) -> str:
    cmd = "python build.py ci"
    return cmd if str(registry) == DEFAULT_REGISTRY else f"{cmd} --registry {registry}"


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        variable_start_string="[[",
        variable_end_string="]]",
        block_start_string="[%",
        block_end_string="%]",
        comment_start_string="[#",
        comment_end_string="#]",
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_workflows(m: Manifests, registry: Registry | str = DEFAULT_REGISTRY) -> dict[str, str]:
    """{repo-relative path: text} of every generated workflow."""
    if isinstance(registry, str):
        registry = parse_registry(registry)
    actions = load_actions()
    ci = ci_settings()
    publish_refs = "(github.ref == 'refs/heads/main' || startsWith(github.ref, 'refs/tags/'))"
    context = {
        "regenerate": regenerate_command(registry),
        "registry": str(registry),
        "registry_shell": shell_word(registry),
        "owner_in_registry": needs_owner(registry),
        "login_host": registry.host,
        "ghcr": registry.host == "ghcr.io",
        "repository": IMAGE_REPOSITORY,
        "profiles": image_profiles(m),
        "actions": actions,
        "runner": ci["runner"],
        "stack_runner_default": ci["stack_runner_default"],
        "jobs": ci["jobs"],
        "bump": ci["bump"],
        "wheel_repository": WHEEL_REPOSITORY,
        "build_platform": BUILD_PLATFORM,
        "python_version": RUNNER_PYTHON,
        "cleanup_paths": CLEANUP_PATHS,
        "paths": TRIGGER_PATHS,
        "publish_if": f"github.event_name == 'push' || (github.event_name == 'workflow_dispatch' && {publish_refs})",
        "test_if": f"github.event_name == 'pull_request' || (github.event_name == 'workflow_dispatch' && !{publish_refs})",
    }
    env = _env()
    return {
        IMAGES_WORKFLOW: env.get_template("images.yml.j2").render(context),
        TESTS_WORKFLOW: env.get_template("tests.yml.j2").render(context),
        BUMP_WORKFLOW: env.get_template("bump.yml.j2").render(context),
    }


def registry_in(text: str) -> str | None:
    """The registry recorded in a generated images.yml header, if any."""
    match = HEADER_REGISTRY_RE.search(text)
    return match.group(1) if match else None


def current_registry(root: Path) -> str:
    """The registry of the committed images.yml (so `ci` keeps a custom one), else GHCR."""
    path = root / IMAGES_WORKFLOW
    if path.is_file():
        found = registry_in(path.read_text())
        if found:
            try:
                return str(parse_registry(found))
            except InputError:
                pass
    return DEFAULT_REGISTRY


def stale(root: Path, files: dict[str, str]) -> list[str]:
    """Paths whose committed text differs from `files` (or that are missing)."""
    out = []
    for rel, text in sorted(files.items()):
        path = root / rel
        if not path.is_file() or path.read_text() != text:
            out.append(rel)
    return out


def write(root: Path, files: dict[str, str]) -> list[str]:
    """Write the files that changed; returns their paths."""
    changed = stale(root, files)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel])
    return changed


# -- the job summary -------------------------------------------------------------------------
# The image stage writes `--summary-file PATH` (JSON) after its last step. Keys read here:
#   profile     the profile built
#   image       the local reference that was built and tested (mtp-verl:TAG)
#   pushed      true when pushed
#   references  the pushed references (REGISTRY/NAMESPACE/mtp-verl:TAG, ...)
#   digest      the registry manifest digest of the pushed image (sha256:...)
#   layer_format the format of its layers (gzip, zstd): a pull line that needs a newer
#               client for it says so (runtimes.yaml pull_lines)
# Missing keys only shorten the summary; a missing or unreadable file is reported, not fatal.
def pull_strings(reference: str, digest: str) -> dict[str, str]:
    """Ways to pull REGISTRY/PATH[:TAG] by digest: docker, pyxis (srun), enroot, apptainer."""
    return ImageRef.parse(reference, flag="summary references").pinned(digest).pull_strings()


def _code(text: str) -> str:
    return "`" + str(text).replace("`", "'").replace("|", "\\|") + "`"


def render_summary(
    profile: str, data: dict | None, problem: str | None = None, reproduce: Reproduce | None = None
) -> str:
    """Markdown for $GITHUB_STEP_SUMMARY: one section per image; with `reproduce` (the publish
    job's reproducible image), how to verify it from a clean checkout after the table."""
    lines = [f"### {profile}", ""]
    if data is None:
        lines.append(
            f"No image summary: {problem or 'the build stopped before writing it'}; see the build step's log."
        )
        return "\n".join(lines) + "\n"
    refs = data.get("references") or []
    digest = data.get("digest")
    rows = []
    if data.get("image"):
        rows.append(("built and tested", _code(data["image"])))
    for ref in refs:
        rows.append(("pushed", _code(ref)))
    if digest:
        rows.append(("digest", _code(digest)))
    if refs and digest and data.get("pushed", True):
        try:
            pulls = pull_strings(refs[0], digest)
        except InputError:
            pulls = {}  # not a reference this tool writes: the rows above still say it
        needs = pullneeds.pull_needs(data.get("layer_format"))
        for how, text in pulls.items():
            rows.append((how, _code(text) + (f" ({needs[how]})" if how in needs else "")))
    elif not data.get("pushed"):
        rows.append(("pushed", "no (pull request: build and test only)"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    if reproduce is not None:
        lines += ["", reproduce_markdown(reproduce)]
    return "\n".join(lines) + "\n"


def verify_summary(
    profile: str, image: str, repository: str, platform: str | None = None, index: bool = False
) -> str:
    """Markdown for a sign job: how to check the signature and provenance of `image`
    (REG/mtp-verl@sha256:...) before pulling it: one platform's image (`platform`), or the
    profile's multi-arch index (`index`: what its tag names), whose platforms' images are
    signed each by its own digest."""
    what = "multi-arch index" if index else platform
    lines = [
        f"### {profile}{f' ({what})' if what else ''}: signed",
        "",
        "Verify before pulling:",
        "",
        "```bash",
    ]
    lines += [*verify_commands(image, repository), "```", ""]
    name, _, digest = image.partition("@")
    if index:
        lines += [
            f"This is what `docker pull {name}:{profile}` resolves to. Each platform's image it lists is "
            "signed by its own digest, by the same workflow: read the digests from the index and "
            "verify your node's platform the same way:",
            "",
            "```bash",
            f"docker manifest inspect {image}   # or: skopeo inspect --raw docker://{image}",
            *verify_commands(f"{name}@sha256:PLATFORM_DIGEST", repository),
            "```",
            "",
        ]
    sets = f" --set builds.platform={platform}" if platform and platform != BUILD_PLATFORM else ""
    lines += [
        "Job scripts pinned to this digest, with these checks in their head:",
        "",
        "```bash",
        f"python3 build.py explain --profile {profile}{sets} --target rl --cluster slurm "
        f"--registry {name.rsplit('/', 1)[0]} --digest {digest} --signed-by {repository}",
        "```",
        "",
    ]
    return "\n".join(lines)
