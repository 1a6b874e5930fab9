"""`explain --cluster` options of a multi-node job (node counts, mounts, network), parsed into
an outputs.multinode.Layout. Parsing only; the job itself is outputs/jobscripts.py's.

  python3 build.py explain --profile P --target rl --cluster slurm|apptainer|kuberay \\
      --registry HOST/NS --nodes N [--rollout-nodes M] [--gpus-per-node G] [--mount SRC:DST ...] \\
      [--ray-interface IF] [--nccl-socket-ifname IF] [--gloo-socket-ifname IF] [--ib-hca HCAS]
"""

from __future__ import annotations

from mtpimage import settings
from mtpimage.engine import layercompress
from mtpimage.errors import InputError
from mtpimage.outputs.multinode import Layout


def add_options(p) -> None:
    g = p.add_argument_group("multi-node jobs (with --cluster)")
    g.add_argument(
        "--nodes", type=int, default=1, help="nodes of the job; 2 or more: Ray across nodes (default 1)"
    )
    g.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    g.add_argument(
        "--rollout-nodes",
        type=int,
        default=0,
        help="run rollout on M separate nodes (verl's fully-async trainer); the other nodes train",
    )
    g.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="SRC:DST",
        help="bind a host path into the container on every node (repeatable; default $PWD:/workspace)",
    )
    g.add_argument(
        "--ray-interface", default="", metavar="IF", help="network interface Ray binds to (its IPv4 address)"
    )
    g.add_argument("--nccl-socket-ifname", default="", metavar="IF", help="NCCL_SOCKET_IFNAME for the job")
    g.add_argument("--gloo-socket-ifname", default="", metavar="IF", help="GLOO_SOCKET_IFNAME for the job")
    g.add_argument("--ib-hca", default="", metavar="HCAS", help="NCCL_IB_HCA, e.g. mlx5_0,mlx5_1")
    g.add_argument(
        "--join-timeout",
        type=int,
        default=600,
        metavar="S",
        help="seconds to wait for every node to join Ray (default 600)",
    )
    g.add_argument(
        "--compression",
        choices=list(layercompress.formats()),
        help="with --digest: how the image's layers were published (the job states the runtime "
        "version they need and checks it); without --digest the registry's manifest says",
    )
    g.add_argument(
        "--signed-by",
        metavar="OWNER/REPO",
        help="the GitHub repository whose images workflow signed the image: the job's head then "
        "names the exact `cosign verify` to run before the first pull (default: MTP_SIGNED_BY)",
    )


def signed_by_of(args) -> str | None:
    """OWNER/REPO from --signed-by or MTP_SIGNED_BY; None when neither is given."""
    given = getattr(args, "signed_by", None) or settings.current().get("MTP_SIGNED_BY")
    if not given:
        return None
    owner, _, repo = given.partition("/")
    if not owner or not repo or "/" in repo or any(c.isspace() or c in "'\"$`" for c in given):
        raise InputError(
            "--signed-by", given, "expected OWNER/REPO", "pass the GitHub repository, e.g. acme/mtp-images"
        )
    return given


def layout_of(args) -> Layout:
    return Layout(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        rollout_nodes=args.rollout_nodes,
        mounts=tuple(args.mount),
        ray_interface=args.ray_interface,
        nccl_socket_ifname=args.nccl_socket_ifname,
        gloo_socket_ifname=args.gloo_socket_ifname,
        ib_hca=args.ib_hca,
        join_timeout_s=args.join_timeout,
    )
