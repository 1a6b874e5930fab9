"""Per-layer size table after each build, and the optional size budget of a profile.

`after_build(plan, image_id, eng, say)` prints one row per layer of the built image (bytes as
stored locally, uncompressed, from the engine's layer history: dockerd's for the docker
engine; for the reproducible engine its OCI layout's, each layer's tar as pushed, so a layer
that holds only directories still has its row), the total, and the profile's
`size_budget_gb` when it has one; it raises SizeBudgetExceeded (exit 1) when the image
is larger than the budget, so a too-big image is never tagged or pushed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mtpimage import engine
from mtpimage.errors import EXIT_RULES, BuilderError

GB = 1000**3


class SizeBudgetExceeded(BuilderError):
    exit_code = EXIT_RULES


@dataclass(frozen=True)
class LayerRow:
    index: int  # 0 = first layer of the base image
    size: int  # bytes, uncompressed
    created_by: str  # the Dockerfile instruction, shortened


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _short(created_by: str, width: int = 64) -> str:
    text = " ".join(created_by.split())
    if not text:
        return "(base image)"
    names = re.findall(r"mtp_install\.py record --name (\S+)", text)
    if names:  # one catalogue layer of the template
        return "RUN install " + ", ".join(names)
    files = re.findall(r"-r /tmp/mtp-build/requirements/(\S+?)-\w+\.txt", text)
    if files:  # a locked layer's PyPI dependencies
        return f"RUN install {files[0]} dependencies"
    # buildah's form of a RUN: `|2 K=V K=V /bin/sh -c --mount=... --mount=... COMMAND`
    buildah_run = re.match(
        r"^(?:\|\d+ (?:\S+=\S* )*)?/bin/sh -c (?!#\(nop\) )((?:--mount=\S+\s+)*)(.*)$", text
    )
    if buildah_run and (text.startswith("|") or buildah_run.group(1)):
        text = "RUN " + buildah_run.group(2)
    for prefix in ("/bin/sh -c #(nop) ", "/bin/sh -c "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if "-euc " in text:  # RUN under the template's bash SHELL
        text = "RUN " + text.split("-euc ", 1)[1]
    return text if len(text) <= width else text[: width - 3] + "..."


def layer_rows(image: str, eng: engine.ContainerEngine) -> list[LayerRow]:
    """Layers of `image` that hold bytes, oldest first (metadata-only steps are left out), as
    the engine that built it counts them."""
    entries = eng.history(image)
    return [LayerRow(i, size, _short(created)) for i, (size, created) in enumerate(entries) if size > 0]


def table(rows: list[LayerRow]) -> str:
    total = sum(r.size for r in rows)
    lines = [f"{'layer':>5}  {'size':>9}  {'share':>6}  created by"]
    for r in rows:
        share = 100.0 * r.size / total if total else 0.0
        lines.append(f"{r.index:>5}  {human(r.size):>9}  {share:5.1f}%  {r.created_by}")
    lines.append(f"{'total':>5}  {human(total):>9}")
    return "\n".join(lines)


def check_budget(profile: str, budget_gb: float | None, total: int) -> str | None:
    """None when there is no budget; a one-line verdict when within it; raises when over."""
    if budget_gb is None:
        return None
    limit = budget_gb * GB
    if total > limit:
        raise SizeBudgetExceeded(
            f"image of profile {profile} is {human(total)}, over its size_budget_gb {budget_gb:g} "
            f"({human(total - limit)} too much; the image was not tagged) (fix: drop packages, or "
            f"raise size_budget_gb in manifests/profiles/{profile}.yaml)"
        )
    return f"size    {human(total)} of the {budget_gb:g} GB budget ({100.0 * total / limit:.0f}%)"


def after_build(plan, image_id: str, eng: engine.ContainerEngine, say=print) -> int:
    """Print the layer table of the image `eng` built; enforce the profile's size budget.
    Returns the total bytes."""
    rows = layer_rows(image_id, eng)
    say(table(rows))
    total = sum(r.size for r in rows)
    verdict = check_budget(plan.profile, getattr(plan, "size_budget_gb", None), total)
    if verdict:
        say(verdict)
    return total
