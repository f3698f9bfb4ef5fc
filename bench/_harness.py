"""What every bench script stands on: a simulated cluster and the W&B test backend.

A CPU-less head plus one-CPU worker nodes (``ray.cluster_utils.Cluster``), connected, and
the test backend on 127.0.0.1 with the driver's W&B environment pointed at it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.wandb_backend import WandbTestBackend

WORK_DIR = "/tmp/ray_wandb_nodes_bench"
# The Train controller otherwise takes one report per 2 s (set before Ray starts).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


@contextmanager
def test_backend(wandb_dir: str = WORK_DIR) -> Iterator[WandbTestBackend]:
    """The W&B test backend on 127.0.0.1, with this process's W&B environment pointed at it."""
    os.makedirs(wandb_dir, exist_ok=True)
    with WandbTestBackend() as backend:
        os.environ.update(
            WANDB_BASE_URL=backend.base_url,
            WANDB_API_KEY="b" * 40,
            WANDB_SILENT="true",
            WANDB_ERROR_REPORTING="false",
            WANDB_DIR=wandb_dir,
        )
        yield backend


@contextmanager
def simulated_cluster(worker_nodes: int, cpus_per_node: int = 1) -> Iterator[tuple[Any, WandbTestBackend]]:
    import ray
    from ray.cluster_utils import Cluster

    with test_backend() as backend:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        try:
            for _ in range(worker_nodes):
                cluster.add_node(num_cpus=cpus_per_node)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            yield cluster, backend
        finally:
            ray.shutdown()
            cluster.shutdown()


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write ``result`` as JSON with the machine and the date."""
    import json
    import time

    result = {
        **result,
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "date": time.strftime("%Y-%m-%d"),
    }
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
