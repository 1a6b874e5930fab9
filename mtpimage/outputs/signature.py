"""How to check a published image's keyless signature and provenance before pulling it.

The images workflow (outputs/workflow.py) signs each pushed digest (each platform's image and
the profile's multi-arch index) with cosign under the workflow's GitHub OIDC identity and
attests its build provenance; the sign jobs' summaries and the job scripts of `explain
--cluster` print these commands, so whoever pulls the digest can check first who built it and
from which workflow."""

from __future__ import annotations

OIDC_ISSUER = "https://token.actions.githubusercontent.com"
WORKFLOW_PATH = ".github/workflows/images.yml"
PLACEHOLDER = "OWNER/REPO"


def identity_regexp(repository: str) -> str:
    return f"^https://github.com/{repository}/{WORKFLOW_PATH}@"


def verify_commands(image: str, repository: str | None) -> list[str]:
    """Shell lines that check `image` (REG/NAME@sha256:...) signed by `repository`'s images
    workflow; without a repository, OWNER/REPO stands where it goes."""
    repo = repository or PLACEHOLDER
    return [
        f"cosign verify {image} \\",
        f"  --certificate-identity-regexp '{identity_regexp(repo)}' \\",
        f"  --certificate-oidc-issuer {OIDC_ISSUER}",
        f"gh attestation verify oci://{image} --owner {repo.split('/', 1)[0]}",
    ]


def comment_lines(image: str, repository: str | None) -> list[str]:
    """The same, as comment lines for the head of a job script or manifest."""
    lead = "Before the first pull, check the image's signature and provenance"
    if repository is None:
        lead += f" ({PLACEHOLDER}: the repository whose images workflow published it; --signed-by or MTP_SIGNED_BY fills it in)"
    return [f"{lead}:"] + [f"  {line}" for line in verify_commands(image, repository)]
