"""Cluster-ready job scripts (Slurm + pyxis, Apptainer) for a published, tested image.

Pure rendering: the caller supplies the digest (looked up in the registry), so the
script always names the exact image that passed its tests.
"""
from __future__ import annotations

import shlex
from importlib import resources

import jinja2

from .plan import IMAGE_REPOSITORY, Plan, verl_facts

FORMATS = ("slurm", "apptainer")


def _env() -> jinja2.Environment:
    text = {name: resources.files("mtpimage.templates").joinpath("cluster", f"{name}.sh.j2").read_text()
            for name in FORMATS}
    env = jinja2.Environment(loader=jinja2.DictLoader(text), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def prerequisites(plan: Plan) -> list[str]:
    out = []
    if "mimo" in plan.models:
        want = verl_facts()["model_config"]["mimo"]["max_position_embeddings"]
        out.append(f'MiMo models: set "max_position_embeddings": {want} in the model\'s config.json '
                   "before the first run (upstream's RL example fails without it)")
    out.append("the model must carry MTP weights (num_nextn_predict_layers > 0), or every MTP "
               "setting is a no-op and verl refuses mtp.enable=True")
    return out


def job_script(plan: Plan, target: str, cluster: str, registry_host: str, repo_path: str,
               digest: str) -> str:
    entry = verl_facts()["entrypoint"][target]
    ctx = {
        "profile": plan.profile, "mode": plan.mode, "target": target,
        "entrypoint": entry, "overrides": plan.overrides_for(target),
        "prerequisites": prerequisites(plan),
        "pyxis_image": f"{registry_host}#{repo_path}@{digest}",
        "docker_uri": f"docker://{registry_host}/{repo_path}@{digest}",
        "sif": f"{IMAGE_REPOSITORY}-{plan.profile}-{digest.split(':')[1][:12]}.sif",
    }
    return _env().get_template(cluster).render(**ctx)
