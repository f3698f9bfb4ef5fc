"""A driver that trains until it is interrupted: ``python -m tests.support.abort_driver ADDRESS NAME STORAGE``.

Ctrl-C (SIGINT) on a driver whose ``fit()`` runs on its main thread is how a Ray Train run is
aborted: Ray aborts the Train controller. The W&B settings come from the environment, as a
user's would.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def endless_loop(config: dict[str, Any]) -> None:
    import time

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    for step in range(10_000):
        time.sleep(0.3)
        ray.train.report({"step": step, "rank": rank})


def main(address: str, name: str, storage: str) -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback
    from tests.support.env import FAST

    ray.init(address=address, log_to_driver=False)
    os.makedirs(storage, exist_ok=True)
    with open(os.path.join(storage, "driver-node"), "w") as f:  # where the Train controller runs
        f.write(ray.get_runtime_context().get_node_id())
    callback = WandbNodesCallback(
        project="abort", sampling_interval_s=0.5, init_timeout_s=30, finish_timeout_s=30, settings=FAST
    )
    TorchTrainer(
        endless_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=[callback]),
    ).fit()


if __name__ == "__main__":
    main(*sys.argv[1:4])
