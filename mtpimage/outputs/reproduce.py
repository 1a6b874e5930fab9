"""How anyone checks that a published image is what its revision builds: a clean checkout of
this project at the image's revision (its `org.opencontainers.image.revision` label), then
`verify`, which rebuilds the plan on a clean builder and compares it bit for bit.

The images workflow's publish job builds with the reproducible engine and its summary prints
these commands for the digest it pushed (outputs/workflow.py); README.md, "Verify the image
you pulled", shows the same lines with placeholders (tests/unit/test_readme_commands.py holds
the two to `commands`). A digest is only worth verifying on a builder like the one that made
it (the digest follows buildah's version: docs/reproducible-builds-and-verify.md), so the
summary names that builder too.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass

from mtpimage.errors import BuilderError
from mtpimage.imageref import ImageRef

REVISION_LABEL = "org.opencontainers.image.revision"
SOURCE_LABEL = "org.opencontainers.image.source"
CHECKOUT = "mtp-image-builder"  # the folder `git clone` makes (named, so `cd` can follow)
# Stand-ins a reader replaces: where the label could not be read, and in the README.
REVISION_PLACEHOLDER = "REVISION"
SOURCE_PLACEHOLDER = "https://github.com/OWNER/REPO"


@dataclass(frozen=True)
class Reproduce:
    """What a verifier needs of one published image."""

    profile: str
    image: str  # REG/NS/mtp-verl@sha256:... (by digest: a tag can move)
    source: str  # this project's repository, as the image's source label names it
    revision: str  # the commit it was built from (the revision label)
    wheel_share: str | None = None  # MTP_WHEEL_CACHE_REPO: the compiled extensions' wheels
    builder: str | None = None  # "buildah 1.33.7 on Ubuntu 24.04.2 LTS": the builder that made it
    platform: str | None = None  # builds.platform where it is not the lock's (linux/arm64)


def label_command(image: str) -> str:
    """Read the revision label of a pulled image (docker's own inspect, nothing installed)."""
    return f"docker inspect --format '{{{{ index .Config.Labels \"{REVISION_LABEL}\" }}}}' {image}"


def commands(r: Reproduce) -> list[str]:
    """The shell lines: clone, check out the revision, verify. The wheel share is named so the
    rebuild installs the same compiled wheels by sha256 instead of compiling them again (nvcc
    does not build the same .so twice)."""
    lines = [f"git clone {r.source} {CHECKOUT}", f"cd {CHECKOUT}", f"git checkout {r.revision}"]
    if r.wheel_share:
        lines.append(f"export MTP_WHEEL_CACHE_REPO={r.wheel_share}")
    on = f" --platform {r.platform}" if r.platform else ""
    lines.append(f"python3 build.py verify --profile {r.profile} --image {r.image}{on}")
    return lines


def markdown(r: Reproduce) -> str:
    """The publish job's summary section."""
    built = f" by {r.builder}" if r.builder else ""
    lines = [
        "#### Verify it",
        "",
        f"Built reproducibly{built}: anyone can rebuild it from a clean checkout at its revision "
        "and compare every layer, the config and the manifest digest (as root, with buildah and "
        "dockerd; it takes about as long as the build, and needs a builder with the same buildah "
        "version):",
        "",
        "```bash",
    ]
    if r.revision == REVISION_PLACEHOLDER:
        lines.append(f"{label_command(r.image)}  # the image has no revision here: read it")
    lines += [*commands(r), "```", ""]
    return "\n".join(lines)


def pinned(reference: str, digest: str) -> str:
    """REG/NS/mtp-verl:TAG and its digest -> REG/NS/mtp-verl@sha256:..."""
    return str(ImageRef.parse(reference, flag="summary references").pinned(digest))


def for_published(
    profile: str,
    data: dict,
    labels,
    wheel_share: str | None,
    builder: str | None,
    platform: str | None = None,
):
    """A Reproduce for the summary's pushed image, or None when nothing was pushed. `labels`
    reads the local image's labels (the engine's); a failure there leaves placeholders, never
    an error: the summary must not fail the job."""
    refs, digest = data.get("references") or [], data.get("digest")
    if not (data.get("pushed") and refs and digest):
        return None
    try:
        image = pinned(refs[0], digest)
    except BuilderError:
        return None
    found: dict = {}
    if data.get("image"):
        try:
            found = labels(data["image"]) or {}
        except (BuilderError, OSError, ValueError, subprocess.SubprocessError):
            found = {}
    return Reproduce(
        profile=profile,
        image=image,
        source=found.get(SOURCE_LABEL) or SOURCE_PLACEHOLDER,
        revision=found.get(REVISION_LABEL) or REVISION_PLACEHOLDER,
        wheel_share=wheel_share,
        builder=builder,
        platform=platform,
    )


def describe_builder(describe) -> str | None:
    """'buildah X on OS' from the reproducible engine's `describe` ('/usr/bin/buildah (buildah
    X, reproducible: ...)'; the whole text where it reads otherwise); None when buildah is
    missing."""
    try:
        text = describe()
    except (BuilderError, OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\(buildah ([^,)\s]+)", text)
    version = f"buildah {found.group(1)}" if found else text
    try:
        system = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        system = ""
    return version + (f" on {system}" if system else "")
