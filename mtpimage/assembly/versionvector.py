"""The version vector: what an image contains, as JSON at /opt/mtp/version.json.

A pure function of the recipe (mtpimage/assembly/recipe.py: the Plan, the locked rows the image
installs, the compiled extensions' keys; no clock, no host facts), so the same Plan renders
the same bytes. The in-image checks compare what is installed against it, and
images/checks/gpu_check.py reads its `mode` and `engine`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mtpimage import __version__, children, settings
from mtpimage.locations import CHECKOUT
from mtpimage.lock.probetable import component_of, probe_specs
from mtpimage.manifests import modes
from mtpimage.manifests.modes import verl_facts
from mtpimage.plan import rules
from mtpimage.plan.model import Plan
from mtpimage.publish.baseplatform import BUILD_PLATFORM, UNRECORDED

if TYPE_CHECKING:  # annotations only: who reads VECTOR_PATH or LABEL_NS need not load the renderer
    from mtpimage.assembly.recipe import Recipe

VECTOR_SCHEMA = "mtp-image-builder/version-vector/v1"
VECTOR_PATH = "/opt/mtp/version.json"
LABEL_NS = "io.mtp-image-builder"


def probes_for(plan: Plan) -> list[str]:
    """Source probes to repeat on the installed stack: ids of mtpimage/data/probes.yaml, whose
    entries the version vector carries to images/checks/run_checks.py."""
    f = rules.facts()
    out = []
    rc = plan.recompute or {}
    if (
        rc.get("granularity") == "full"
        and modes.get(plan.mode).trains_mtp
        and component_of(plan, "recompute-padding-mask") is not None
    ):
        out.append("recompute-padding-mask")
    sg = component_of(plan, "sglang-ipc-unwrap")
    if sg is not None and f["sglang"]["fix_patch_provides"] in sg.provides():
        out.append("sglang-ipc-unwrap")
    if (
        component_of(plan, "mbridge-mcore-017") is not None
        and plan.training_engine_dict().get("bridge") == "mbridge"
    ):
        out.append("mbridge-mcore-017")
    if (
        "mimo" in plan.models
        and plan.training_engine_dict().get("bridge") == "megatron-bridge"
        and component_of(plan, "mimo-needs-bridge-2387") is not None
    ):
        out.append("mimo-needs-bridge-2387")
    return out


def _patch(p) -> dict:
    """A patch as the image records it. `file` is its name in the build context for a patch
    by reference (the in-image checks match the applied files by it), its manifests path for
    a local file."""
    d = {
        "file": p.name if p.repo else p.file,
        "sha256": p.sha256,
        "url": p.url,
        "strip": p.strip,
        "provides": list(p.provides),
    }
    if p.repo:
        d.update(repo=p.repo, base=p.base, head=p.head, paths=list(p.paths))
    return d


def base_platform(plan: Plan) -> dict:
    """The manifest the image starts from: the plan's platform (builds.platform; the build
    platform unless set) and, as lock.yaml recorded it, what the base digest names (an index or
    a single-platform image) and that platform's manifest digest; `unrecorded` and null where
    the lock has no record (made where the registry did not answer, or a substituted base)."""
    bp = plan.base_platform
    if bp is None:
        return {"platform": plan.platform or BUILD_PLATFORM, "manifest": UNRECORDED, "digest": None}
    return {"platform": bp.platform, "manifest": bp.manifest, "digest": bp.digest}


def version_vector(recipe: Recipe) -> dict:
    plan = recipe.plan
    extensions = recipe.extensions
    facts = verl_facts()
    mode = modes.get(plan.mode)
    components = []
    for c in plan.components:
        components.append(
            {
                "name": c.name,
                "source": c.source,
                "package": c.package,
                "layer": c.layer,
                "repo": c.repo,
                "ref": c.ref,
                "commit": c.commit,
                "version": c.version,
                "index": c.index,
                "extras": list(c.extras),
                "dependencies_declared": c.deps_declared,
                "entry_checks": [
                    dict(e) for e in c.entry_checks if e.get("target", "") in ("",) + plan.targets
                ],
                "patches": [_patch(p) for p in c.patches],
                **({"runtime_env": dict(c.runtime_env)} if c.runtime_env else {}),
            }
        )
    return {
        "schema": VECTOR_SCHEMA,
        "builder": {"name": "mtp-image-builder", "version": __version__},
        "profile": plan.profile,
        "summary": plan.summary,
        "experimental": plan.experimental,
        "mode": plan.mode,
        "trains_mtp": mode.trains_mtp,
        "mtp_contract": mode.contract,
        "mtp_config": dict(mode.mtp_config),
        "targets": list(plan.targets),
        "models": list(plan.models),
        "engine": plan.training_engine_dict(),
        "rollout_engine": plan.rollout_engine,
        "python": plan.python,
        "cuda": plan.cuda,
        "base_image": plan.base_image,
        "base_platform": base_platform(plan),
        "plan_digest": plan.digest,
        "components": components,
        "packages": [
            {
                "name": p.name,
                "version": p.version,
                "index": p.index,
                "layer": p.layer,
                "extras": list(p.extras),
            }
            for p in plan.packages
        ],
        "layers": [{"name": layer.name, "items": list(layer.items)} for layer in plan.layers],
        "verl_overrides": {t: list(lines) for t, lines in plan.verl_cli_overrides},
        "entrypoints": {t: facts["entrypoint"][t] for t in plan.targets},
        "probes": {pid: probe_specs()[pid] for pid in probes_for(plan)},
        "resolution": {
            "overrides": [{"requirement": r, "why": w, "link": l} for r, w, l in plan.resolution_overrides],
            "excludes": [{"package": n, "why": w, "link": l} for n, w, l in plan.excludes],
            "sdists": [{"package": n, "why": w} for n, w in plan.sdists],
        },
        "python_packages": {r.name: r.version for r in recipe.image_rows()},
        "substitutions": [{"what": w, "detail": d} for w, d in plan.substitutions],
        **({"extensions": list(extensions)} if extensions else {}),
        **(
            {"routes": [{"package": n, "choice": c, "why": w} for n, c, w in plan.routes]}
            if plan.routes
            else {}
        ),
    }


def vector_bytes(recipe: Recipe) -> bytes:
    return (json.dumps(version_vector(recipe), indent=2, sort_keys=True) + "\n").encode()


def _git(*args: str) -> str | None:
    """git in this project's checkout; None for an installed tool (no checkout: a git
    repository around site-packages is someone else's project, not this one)."""
    import subprocess

    if CHECKOUT is None:
        return None
    try:
        proc = children.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def project_url() -> str | None:
    """Where this project (the image's definition) lives: MTP_PROJECT_URL, else GitHub Actions'
    repository, else an https `origin` remote; None when none is known (no label then)."""
    import os

    if settings.current().project_url:
        return settings.current().project_url
    if os.environ.get("GITHUB_SERVER_URL") and os.environ.get("GITHUB_REPOSITORY"):
        return f"{os.environ['GITHUB_SERVER_URL']}/{os.environ['GITHUB_REPOSITORY']}"
    origin = _git("config", "--get", "remote.origin.url") or ""
    return origin.removesuffix(".git") if origin.startswith("https://") else None


def identity_labels(identity: str) -> dict[str, str]:
    """Labels given to the build with --label, outside the rendered Dockerfile, so they never
    change the identity: the identity tag itself (a hash of that Dockerfile); where the image's
    definition lives (this project's repository and commit: OCI `source`/`revision`); and
    `created` only from SOURCE_DATE_EPOCH, so a reproducible build stays reproducible."""
    import datetime
    import os

    out = {f"{LABEL_NS}.identity": identity}
    url = project_url()
    if url:
        out.update(
            {
                "org.opencontainers.image.source": url,
                "org.opencontainers.image.url": url,
                "org.opencontainers.image.documentation": f"{url}#readme",
            }
        )
    rev = _git("rev-parse", "HEAD")
    if rev:
        out["org.opencontainers.image.revision"] = rev
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    if epoch.isdigit():
        out["org.opencontainers.image.created"] = datetime.datetime.fromtimestamp(
            int(epoch), datetime.UTC
        ).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def labels(plan: Plan, repository: str) -> dict[str, str]:
    """OCI annotations plus the project's namespace, written as LABEL in the mode layer.
    No timestamps, so renders stay byte-identical."""
    out = {
        "org.opencontainers.image.title": f"{repository}:{plan.profile}",
        "org.opencontainers.image.description": plan.summary,
        "org.opencontainers.image.vendor": "mtp-image-builder",
        "org.opencontainers.image.base.name": plan.base_image.split("@")[0],
        f"{LABEL_NS}.profile": plan.profile,
        f"{LABEL_NS}.mode": plan.mode,
        f"{LABEL_NS}.plan-digest": plan.digest,
        f"{LABEL_NS}.version-vector": VECTOR_PATH,
        f"{LABEL_NS}.engine": json.dumps(plan.training_engine_dict(), sort_keys=True, separators=(",", ":")),
    }
    if plan.base_digest:
        out["org.opencontainers.image.base.digest"] = plan.base_digest
    verl = plan.component("verl")
    # OCI `version` is the packaged software's version: the stack's head, verl; verl's origin
    # stays in this project's namespace (OCI source/revision say where the image is defined)
    if verl is not None:
        out["org.opencontainers.image.version"] = verl.version or (verl.commit or "")[:12]
        if verl.source == "git":
            out[f"{LABEL_NS}.verl.source"] = verl.repo or ""
            out[f"{LABEL_NS}.verl.revision"] = verl.commit or ""
    # the licenses of what the image packages (verl, Megatron-LM, Megatron-Bridge, sglang, torch)
    out["org.opencontainers.image.licenses"] = "Apache-2.0 AND BSD-3-Clause"
    for c in plan.components:
        out[f"{LABEL_NS}.component.{c.name}"] = c.pin
    if plan.substitutions:
        out[f"{LABEL_NS}.substitutions"] = "; ".join(f"{w}: {d}" for w, d in plan.substitutions)
    for target, lines in plan.verl_cli_overrides:
        out[f"{LABEL_NS}.verl-overrides.{target}"] = " ".join(lines)
    return dict(sorted(out.items()))
