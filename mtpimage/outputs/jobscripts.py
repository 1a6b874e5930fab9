"""Cluster-ready job scripts (Slurm + pyxis, Apptainer) for a published, tested image.

`job_script` is pure rendering from a digest; `published_job_script` finds that digest
in the registry (the content tag of this plan's tested image), so the script always names
the exact image that passed its tests.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from pathlib import Path

import jinja2

from mtpimage.errors import InputError
from mtpimage.plan.model import IMAGE_REPOSITORY, Plan, verl_facts
from mtpimage.publish.imageref import ImageRef, Registry

FORMATS = ("slurm", "apptainer")


def _env() -> jinja2.Environment:
    text = {
        name: resources.files("mtpimage.templates").joinpath("cluster", f"{name}.sh.j2").read_text()
        for name in FORMATS
    }
    env = jinja2.Environment(
        loader=jinja2.DictLoader(text),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def prerequisites(plan: Plan) -> list[str]:
    out = []
    if "mimo" in plan.models:
        want = verl_facts()["model_config"]["mimo"]["max_position_embeddings"]
        out.append(
            f'MiMo models: set "max_position_embeddings": {want} in the model\'s config.json '
            "before the first run (upstream's RL example fails without it)"
        )
    out.append(
        "the model must carry MTP weights (num_nextn_predict_layers > 0), or every MTP "
        "setting is a no-op and verl refuses mtp.enable=True"
    )
    return out


def job_script(plan: Plan, target: str, cluster: str, registry_host: str, repo_path: str, digest: str) -> str:
    entry = verl_facts()["entrypoint"][target]
    image = ImageRef(registry_host, repo_path, digest=digest)
    ctx = {
        "profile": plan.profile,
        "mode": plan.mode,
        "target": target,
        "entrypoint": entry,
        "overrides": plan.overrides_for(target),
        "prerequisites": prerequisites(plan),
        "pyxis_image": image.pyxis,
        "docker_uri": image.docker_uri,
        "sif": f"{IMAGE_REPOSITORY}-{plan.profile}-{digest.split(':')[1][:12]}.sif",
    }
    return _env().get_template(cluster).render(**ctx)


def published_job_script(
    plan: Plan, manifests_root: Path, target: str, cluster: str, registry: str, digest: str | None = None
) -> str:
    """The job script, pinned to the digest of this plan's tested image in `registry`
    (HOST[:PORT]/NAMESPACE), or to `digest` when given (no registry look-up then)."""
    from mtpimage.build.render import render

    if not registry:
        raise InputError(
            "--registry",
            None,
            "--cluster needs the registry the image was pushed to",
            "add --registry HOST[:PORT]/NAMESPACE",
        )
    reg = Registry.parse(registry)
    if digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise InputError("--digest", digest, "expected sha256:<64 hex>")
    if digest is None:
        from mtpimage.publish.registryclient import RegistryClient

        identity = render(plan, manifests_root).identity
        digest = RegistryClient(reg).manifest_digest(IMAGE_REPOSITORY, identity)
        if digest is None:
            raise InputError(
                "--registry",
                registry,
                f"{reg.ref(IMAGE_REPOSITORY, identity)} is not published",
                f"run python build.py --profile {plan.profile} --push --registry {registry}",
            )
    return job_script(plan, target, cluster, reg.host, reg.repo_path(IMAGE_REPOSITORY), digest)
