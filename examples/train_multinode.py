"""Train a small torch model on a multi-node Ray cluster; one W&B run shows every node.

    python examples/train_multinode.py                 # local simulated cluster: head + 2 nodes
    RAY_ADDRESS=auto python examples/train_multinode.py --workers 8 --project my-proj

With no W&B account configured (no WANDB_API_KEY, no `wandb login`, no WANDB_MODE), it
runs offline: every node's offline run is brought into one folder, and the example prints
the per-node report of that folder and draws its chart (``ray-wandb-nodes report``), then
says how to upload it all into one W&B run later (``ray-wandb-nodes sync``).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import uuid
from typing import Any

# The Train controller takes one report per health check (2 s by default); a short demo
# reports faster. Set before Ray starts so the controller inherits it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_wandb_nodes import WandbNodesCallback

BATCH = 1024


def train_loop(config: dict[str, Any]) -> None:
    """A tiny regression task, data-parallel across the workers."""
    import torch
    from ray.train.torch import prepare_model

    torch.manual_seed(ray.train.get_context().get_world_rank())
    true_w = torch.arange(1.0, 9.0)
    hidden = 256
    model = prepare_model(
        torch.nn.Sequential(
            torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        started = time.perf_counter()
        total = 0.0
        for _ in range(config["batches"]):
            x = torch.randn(BATCH, 8)
            y = (x @ true_w).unsqueeze(1) + 0.1 * torch.randn(BATCH, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        ray.train.report(
            {
                "epoch": epoch,
                "loss": total / config["batches"],
                "samples_per_s": BATCH * config["batches"] / (time.perf_counter() - started),
            }
        )


def account_configured() -> bool:
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE"):
        return True
    netrc = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    return os.path.isfile(netrc) and "api." in open(netrc).read()


def start_local_cluster() -> Any:
    from ray.cluster_utils import Cluster

    print("Starting a local simulated cluster of three nodes: a head node and two one-CPU worker nodes ...")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default=os.environ.get("WANDB_PROJECT", "ray-wandb-nodes-demo"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--mode", choices=["online", "offline", "disabled"], default=None)
    parser.add_argument("--storage-path", default=os.path.abspath("ray_results"))
    parser.add_argument("--png", default="nodes.png", help="where the offline report's chart goes")
    args = parser.parse_args()

    mode = args.mode or (None if account_configured() else "offline")
    wandb_dir = os.environ.get("WANDB_DIR") or os.path.abspath("wandb_runs")
    os.makedirs(wandb_dir, exist_ok=True)
    if mode == "offline":
        print(f"No W&B account configured: logging offline under {wandb_dir}")

    cluster = None if os.environ.get("RAY_ADDRESS") else start_local_cluster()
    if cluster is None:
        ray.init()
    name = f"train-multinode-{uuid.uuid4().hex[:6]}"
    callback = WandbNodesCallback(
        project=args.project,
        mode=mode,
        sampling_interval_s=1.0,
        dir=wandb_dir,
        tags=["ray-wandb-nodes-example"],
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"lr": 0.01, "epochs": args.epochs, "batches": 40},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(name=name, storage_path=args.storage_path, callbacks=[callback]),
    )
    try:
        started = time.perf_counter()
        trainer.fit()
        print(f"Training finished in {time.perf_counter() - started:.1f}s")
        nodes = [n for n in ray.nodes() if n["Alive"]]
        print(f"The cluster had {len(nodes)} nodes; the W&B run {name!r} holds the system metrics of each.")
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()

    if mode == "offline":
        return report_offline(wandb_dir, name, args.png)
    return 0


def report_offline(wandb_dir: str, name: str, png: str) -> int:
    """Print the per-node report of the run's offline folder and draw its chart."""
    from ray_wandb_nodes.report import format_text, load, write_png

    folders = glob.glob(os.path.join(wandb_dir, "ray_wandb_nodes", f"{name}-*"))
    if len(folders) != 1:
        print(f"Expected one offline run folder for {name!r} under {wandb_dir}, found {folders}")
        return 1
    folder = folders[0]
    print(f"\nAll of the run's offline data is in one folder: {folder}")
    print(f"Its report (ray-wandb-nodes report {os.path.relpath(folder)}):\n")
    reports = load(folder)
    print(format_text(reports))
    try:
        for path in write_png(reports, png):
            print(f"Chart of every node: {path}")
    except ImportError as e:
        print(f"No chart: {e}")
    print(f"Upload it into one W&B run later, from a machine with W&B access:\n  ray-wandb-nodes sync {folder}")
    return 1 if any(r.errors for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
