"""Cluster-ready jobs (Slurm + pyxis, Apptainer, KubeRay) for a published, tested image.

`job_script` is pure rendering from a digest; `published_job_script` finds that digest
in the registry (the content tag of this plan's tested image), so the job always names
the exact image that passed its tests. One node: a plain sbatch script; several nodes: Ray
across nodes (outputs/multinode.py); `kuberay`: a RayJob (outputs/rayjob.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from mtpimage import invocation
from mtpimage.assembly import driver, formattags
from mtpimage.assembly.render import render
from mtpimage.errors import InputError
from mtpimage.imageref import ImageRef, Registry
from mtpimage.outputs import multinode, rayjob, runtimes
from mtpimage.outputs.preflight import DRIVER_CHECK, preflighted
from mtpimage.outputs.signature import comment_lines
from mtpimage.plan.model import IMAGE_REPOSITORY, Plan, verl_facts
from mtpimage.publish.registryclient import RegistryClient

FORMATS = ("slurm", "apptainer", "kuberay")
# the runtimes.yaml runtime that pulls the image of a --cluster form (pyxis pulls through enroot)
RUNTIME_OF = {"slurm": "enroot", "apptainer": "apptainer"}
_TEMPLATES = (
    "slurm.sh.j2",
    "apptainer.sh.j2",
    "multinode.sbatch.j2",
    "ray_node.sh.j2",
    "ray_wait.py.j2",
    "pull_check.sh.j2",
    "sif_build.sh.j2",
)


def _env() -> jinja2.Environment:
    text = {name: multinode.template_text(name) for name in _TEMPLATES}
    env = jinja2.Environment(
        loader=jinja2.DictLoader(text),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        comment_start_string="{##",  # bash's ${#ARRAY[@]} is not a comment
        comment_end_string="##}",
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


@dataclass(frozen=True)
class Layers:
    """The pulled image's layer format (gzip, zstd; None: not known) and where it was learned."""

    format: str | None = None
    known_from: str = ""


def prerequisites(plan: Plan) -> list[str]:
    # the node's driver first: the preflight checks it, but a site plans its nodes by it
    out = [driver.need(plan.cuda).prerequisite()]
    if plan.cuda_archs:  # what its compiled extensions run on (issue 49): the preflight holds to it
        out.append(
            f"GPUs the image's compiled extensions carry code for: {driver.served(plan.cuda_archs)}; "
            "the preflight refuses any other (an image for more: builds.cuda_archs)"
        )
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


def command_line(plan: Plan, target: str, cluster: str, layout: multinode.Layout) -> str:
    """The explain command that writes this job (for the job's header)."""
    words = [
        "python",
        "build.py",
        "explain",
        "--profile",
        plan.profile,
        "--target",
        target,
        "--cluster",
        cluster,
    ]
    if layout.nodes > 1 or cluster == "kuberay":
        words += ["--nodes", str(layout.nodes), "--gpus-per-node", str(layout.gpus_per_node)]
    if layout.rollout_nodes:
        words += ["--rollout-nodes", str(layout.rollout_nodes)]
    return shlex.join(words)


def _sif(plan: Plan, digest: str) -> str:
    return f"{IMAGE_REPOSITORY}-{plan.profile}-{digest.split(':')[1][:12]}.sif"


def _pulls(cluster: str, image: ImageRef, layers: Layers) -> dict:
    """The template values of what the job pulls: the layer format and the runtime version it
    needs (pull_check.sh.j2), the SIF's compression (sif_build.sh.j2)."""
    rt = runtimes.runtime(RUNTIME_OF[cluster])
    pulled = image.pyxis if cluster == "slurm" else image.docker_uri
    return {
        "pull": runtimes.Pull(rt, pulled, layers.format, layers.known_from),
        "sif": rt.sif_build() if cluster == "apptainer" else None,
    }


def multinode_script(
    plan: Plan,
    target: str,
    cluster: str,
    image: ImageRef,
    layout: multinode.Layout,
    signed_by: str | None = None,
    layers: Layers = Layers(),
) -> str:
    """The sbatch script that runs Ray across `layout.nodes` nodes, then verl's trainer."""
    entry, args = multinode.trainer_command(plan, target, layout)
    facts = multinode.facts()
    ctx = {
        "profile": plan.profile,
        "mode": plan.mode,
        "target": target,
        "runtime": multinode.RUNTIMES[cluster],
        "command": command_line(plan, target, cluster, layout),
        "placement": multinode.placement_note(plan),
        "prerequisites": prerequisites(plan),
        "verify": comment_lines(str(image), signed_by),
        "pyxis_image": image.pyxis,
        "docker_uri": image.docker_uri,
        "sif_path": _sif(plan, image.digest or ""),
        **_pulls(cluster, image, layers),
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "mounts": ",".join(layout.mounts) or "$PWD:/workspace",
        "ray_port": facts["ray"]["port"],
        "ray_interface": layout.ray_interface,
        "join_timeout_s": layout.join_timeout_s,
        "network_env": layout.network_env,
        "entrypoint": entry,
        "trainer_args": args,
        "driver_check": DRIVER_CHECK,
    }
    return _env().get_template("multinode.sbatch.j2").render(**ctx)


def job_script(
    plan: Plan,
    target: str,
    cluster: str,
    registry_host: str,
    repo_path: str,
    digest: str,
    layout: multinode.Layout | None = None,
    signed_by: str | None = None,
    layers: Layers = Layers(),
) -> str:
    """signed_by: OWNER/REPO whose images workflow signed the digest (the script's head says
    how to check that before the first pull); layers: the image's layer format, as far as
    it is known (the script says it and checks the node's runtime for it)."""
    layout = layout or multinode.Layout()
    image = ImageRef(registry_host, repo_path, digest=digest)
    if cluster == "kuberay" or layout.nodes != 1:
        multinode.check(plan, target, layout)
        if cluster == "kuberay":
            command = command_line(plan, target, cluster, layout)
            verify = comment_lines(str(image), signed_by)
            return rayjob.rayjob_yaml(plan, target, image, layout, command, prerequisites(plan), verify)
        return multinode_script(plan, target, cluster, image, layout, signed_by, layers)
    if layout.rollout_nodes:
        raise InputError(
            "--rollout-nodes", str(layout.rollout_nodes), "a split needs --nodes 2 or more", "add --nodes N"
        )
    entry = preflighted(verl_facts()["entrypoint"][target])
    ctx = {
        "profile": plan.profile,
        "mode": plan.mode,
        "target": target,
        "entrypoint": entry,
        "overrides": plan.verl_cli_overrides_for(target),
        "prerequisites": prerequisites(plan),
        "verify": comment_lines(str(image), signed_by),
        "pyxis_image": image.pyxis,
        "docker_uri": image.docker_uri,
        "sif_path": _sif(plan, digest),
        **_pulls(cluster, image, layers),
    }
    return _env().get_template(f"{cluster}.sh.j2").render(**ctx)


def published_job_script(
    plan: Plan,
    manifests_root: Path,
    target: str,
    cluster: str,
    registry: str,
    digest: str | None = None,
    layout: multinode.Layout | None = None,
    signed_by: str | None = None,
    compression: str | None = None,
) -> str:
    """The job script, pinned to the digest of this plan's tested image in `registry`
    (HOST[:PORT]/NAMESPACE), or to `digest` when given (no registry look-up then). The layer
    format it states comes from the registry's manifest, or with `digest` from `compression`
    (--compression: how the image was published); without either it is not known."""
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
    layers = Layers(compression, "--compression") if compression else Layers()
    if digest is None:
        # the tag of the format asked for (--compression), else of the default format
        identity = formattags.for_format(
            render(plan, manifests_root).identity, plan.profile, compression
        ).content
        got = RegistryClient(reg).manifest(IMAGE_REPOSITORY, identity)
        if got is None:
            raise InputError(
                "--registry",
                registry,
                f"{reg.ref(IMAGE_REPOSITORY, identity)} is not published",
                f"run {invocation.command()} --profile {plan.profile} --push --registry {registry}, "
                "or see the job script before publishing with --digest sha256:...",
            )
        digest = got[1]
        found = runtimes.layer_format(got[0])
        if compression and found and found != compression:
            raise InputError(
                "--compression",
                compression,
                f"the registry's manifest of {reg.ref(IMAGE_REPOSITORY, identity)} has {found} layers",
                "leave --compression out: the registry says how the image was published",
            )
        layers = Layers(found, "the registry's manifest")
    return job_script(
        plan, target, cluster, reg.host, reg.repo_path(IMAGE_REPOSITORY), digest, layout, signed_by, layers
    )
