"""Stand-in for verl's trainer in the multi-node test image: it joins Ray the way verl's
run_ppo does (ray.init with ray_kwargs.ray_init's defaults, num_cpus None, and a runtime_env;
the cluster comes from RAY_ADDRESS), runs one task pinned to each alive node, and prints what
it saw as one JSON line, with the Hydra overrides it was given."""

import json
import socket
import sys

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def where() -> str:
    return socket.gethostname()


def main() -> None:
    ray.init(num_cpus=None, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})
    nodes = [n for n in ray.nodes() if n["Alive"]]
    pinned = [
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        for n in nodes
    ]
    report = {
        "node_names": sorted(n.get("NodeName", "") for n in nodes),
        "task_hosts": sorted(ray.get([p.remote() for p in pinned])),
        "gpus": ray.cluster_resources().get("GPU", 0),
        "argv": sys.argv[1:],
    }
    print("STANDIN-TRAINER " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
