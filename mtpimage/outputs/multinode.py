"""Multi-node verl jobs: the node layout, verl's trainer command for it, and the sbatch script
that runs Ray across nodes under Slurm (pyxis/enroot or Apptainer).

The facts (verl's layout keys, the train/rollout split, ports, network variables, the KubeRay
pin) are data: mtpimage/data/multinode.yaml. The Ray node commands and the wait for every node
are template files (templates/cluster/ray_node.sh.j2, ray_wait.py.j2) shared by the sbatch
script and the KubeRay RayJob (outputs/rayjob.py), so what the tests start is what ships.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from mtpimage.errors import InputError
from mtpimage.manifests.modes import get as get_mode
from mtpimage.manifests.modes import verl_facts
from mtpimage.outputs.preflight import preflighted
from mtpimage.plan.model import Plan

RUNTIMES = {"slurm": "pyxis", "apptainer": "apptainer"}
_IFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")
_HCA = re.compile(r"\^?=?[A-Za-z0-9_.:-]+(?:,[A-Za-z0-9_.:-]+)*")
_MOUNT = re.compile(r"[\w./@+=-]+:[\w./@+=-]+(?::[a-z]+)?")


@cache
def facts() -> dict:
    return yaml.safe_load(resources.files("mtpimage.data").joinpath("multinode.yaml").read_text())


@dataclass(frozen=True)
class Layout:
    """Where a job runs: node counts, GPUs per node, mounts and network settings."""

    nodes: int = 1
    gpus_per_node: int = 8
    rollout_nodes: int = 0  # > 0: train and rollout on separate nodes (verl's fully-async trainer)
    mounts: tuple[str, ...] = ()
    ray_interface: str = ""
    nccl_socket_ifname: str = ""
    gloo_socket_ifname: str = ""
    ib_hca: str = ""
    join_timeout_s: int = 600

    @property
    def train_nodes(self) -> int:
        return self.nodes - self.rollout_nodes

    @property
    def network_env(self) -> list[tuple[str, str]]:
        return [
            (var, getattr(self, opt)) for opt, var in facts()["network_env"].items() if getattr(self, opt)
        ]


def _bad(flag: str, value, why: str, fix: str) -> InputError:
    return InputError(flag, str(value), why, fix)


def check(plan: Plan, target: str, layout: Layout) -> None:
    """One-line errors for a layout verl cannot run; nothing when it can."""
    if target not in facts()["targets"]:
        raise _bad(
            "--target",
            target,
            f"multi-node jobs run verl's Ray trainer; --target {target} runs under torchrun",
            "use --target rl, or --nodes 1 for a single-node job",
        )
    if layout.nodes < 1 or layout.gpus_per_node < 1 or layout.join_timeout_s < 1:
        raise _bad(
            "--nodes",
            layout.nodes,
            "nodes, GPUs per node and the join timeout must be >= 1",
            "pass positive numbers",
        )
    if layout.rollout_nodes and not 0 < layout.rollout_nodes < layout.nodes:
        raise _bad(
            "--rollout-nodes",
            layout.rollout_nodes,
            f"the rollout needs 1 to {layout.nodes - 1} of the {layout.nodes} nodes (the rest train)",
            f"pass --rollout-nodes between 1 and {layout.nodes - 1}, or more --nodes",
        )
    for flag, value, pattern in [
        ("--ray-interface", layout.ray_interface, _IFACE),
        ("--nccl-socket-ifname", layout.nccl_socket_ifname, _HCA),
        ("--gloo-socket-ifname", layout.gloo_socket_ifname, _IFACE),
        ("--ib-hca", layout.ib_hca, _HCA),
    ]:
        if value and not pattern.fullmatch(value):
            raise _bad(
                flag, value, "not an interface or device list", "for example ib0, eth0 or mlx5_0,mlx5_1"
            )
    for mount in layout.mounts:
        if not _MOUNT.fullmatch(mount):
            raise _bad(
                "--mount",
                mount,
                "expected SRC:DST[:FLAGS] without commas or spaces",
                "for example --mount /data:/data",
            )


def placement_note(plan: Plan) -> str:
    """What explain says about where rollout runs for this profile's mode."""
    split = facts()["split"]
    if get_mode(plan.mode).rollout:
        return (
            f"mode {plan.mode} drafts with MTP in rollout: upstream's multi-node example for it "
            f"({split['example']}) runs train and rollout on separate nodes; use --rollout-nodes M"
        )
    return (
        f"mode {plan.mode}: rollout is colocated with training on every node (verl's hybrid engine); "
        "--rollout-nodes M moves it to M separate nodes (verl's fully-async trainer)"
    )


def trainer_command(plan: Plan, target: str, layout: Layout) -> tuple[str, list[str]]:
    """(entry point, Hydra overrides) for the trainer on `layout`: the profile's overrides,
    then the node layout."""
    keys = facts()["layout"]
    if not layout.rollout_nodes:
        entry = preflighted(verl_facts()["entrypoint"][target])
        extra = [f"{keys['nnodes']}={layout.nodes}", f"{keys['gpus_per_node']}={layout.gpus_per_node}"]
        return entry, plan.verl_cli_overrides_for(target) + extra
    split = facts()["split"]
    extra = list(split["overrides"]) + [
        f"{keys['nnodes']}={layout.train_nodes}",
        f"{keys['gpus_per_node']}={layout.gpus_per_node}",
        f"{split['rollout_nnodes']}={layout.rollout_nodes}",
        f"{split['rollout_gpus_per_node']}={layout.gpus_per_node}",
    ]
    return preflighted(split["entrypoint"]), plan.verl_cli_overrides_for(target) + extra


def template_text(name: str) -> str:
    return resources.files("mtpimage.templates").joinpath("cluster", name).read_text()
