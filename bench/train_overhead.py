"""Training speed with no logging, with WandbNodesCallback, and with a rank-0 ``wandb.init``
inside the train loop, side by side on a local simulated cluster.

    python bench/train_overhead.py [--rounds 3] [--steps 300] [--json bench/results/train_overhead.json]

A CPU-less head and two one-CPU worker nodes (each a real raylet), the W&B test backend on
127.0.0.1, and a two-worker TorchTrainer (DDP over gloo) whose loop does a small torch step
and ``ray.train.report``s every step. Rank 0 times the steps after a warm-up and reports
steps per second. The three set-ups run interleaved, in a rotating order, ``--rounds`` times;
ratios are of medians. The whole ``fit()`` is timed too (start-up and the end included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
from _harness import WORK_DIR, simulated_cluster

WARMUP_STEPS = 20


def train_loop(config: dict[str, Any]) -> None:
    import time

    import ray.train
    import torch
    from ray.train.torch import prepare_model

    rank = ray.train.get_context().get_world_rank()
    run = None
    if config["rank0_wandb"] and rank == 0:
        import wandb

        run = wandb.init(project="bench", id=f"rank0-{config['name']}", name=config["name"])
    torch.manual_seed(rank)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    started = None
    for step in range(config["steps"]):
        if step == WARMUP_STEPS:
            started = time.perf_counter()
        x = torch.randn(256, 256)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics = {"step": step, "loss": float(loss)}
        if run is not None:
            run.log(metrics)
        if step == config["steps"] - 1 and started is not None:
            metrics["steps_per_s"] = (config["steps"] - 1 - WARMUP_STEPS) / (time.perf_counter() - started)
        ray.train.report(metrics)
    if run is not None:
        run.finish()


def fit_once(setup: str, steps: int, storage: str) -> tuple[float, float]:
    """(steps per second of rank 0, seconds of the whole fit)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback

    name = f"bench-{setup}-{uuid.uuid4().hex[:6]}"
    callbacks = [WandbNodesCallback(project="bench")] if setup == "callback" else []
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": steps, "rank0_wandb": setup == "rank0_wandb_init", "name": name},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks),
    )
    started = time.perf_counter()
    result = trainer.fit()
    return float(result.metrics["steps_per_s"]), time.perf_counter() - started


SETUPS = ["none", "callback", "rank0_wandb_init"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", default="bench/results/train_overhead.json")
    args = parser.parse_args()

    storage = os.path.join(WORK_DIR, "results")
    rates: dict[str, list[float]] = {s: [] for s in SETUPS}
    fits: dict[str, list[float]] = {s: [] for s in SETUPS}
    with simulated_cluster(worker_nodes=2):
        fit_once("none", WARMUP_STEPS + 5, storage)  # warm-up: imports, worker processes
        for r in range(args.rounds):
            order = SETUPS[r % 3 :] + SETUPS[: r % 3]
            for setup in order:
                rate, seconds = fit_once(setup, args.steps, storage)
                rates[setup].append(rate)
                fits[setup].append(seconds)
                print(f"  round {r + 1} {setup:<17} {rate:7.1f} steps/s   fit {seconds:5.1f} s", flush=True)

    med = {s: statistics.median(v) for s, v in rates.items()}
    fit_med = {s: statistics.median(v) for s, v in fits.items()}
    result = {
        "steps_per_fit": args.steps,
        "warmup_steps": WARMUP_STEPS,
        "rounds": args.rounds,
        "steps_per_s": rates,
        "fit_s": fits,
        "median_steps_per_s": med,
        "median_fit_s": fit_med,
        "ratio_vs_none": {s: med[s] / med["none"] for s in SETUPS},
        "fit_ratio_vs_none": {s: fit_med[s] / fit_med["none"] for s in SETUPS},
        "target": "callback within 2 % of none (steps/s)",
        "machine": f"{os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }
    print()
    print(
        f"{'set-up':<18} {'steps/s median':>14} {'vs none':>8} {'all rounds':>24} {'fit s median':>13} {'vs none':>8}"
    )
    for s in SETUPS:
        spread = ", ".join(f"{x:.1f}" for x in rates[s])
        print(
            f"{s:<18} {med[s]:>14.1f} {result['ratio_vs_none'][s]:>8.3f} {spread:>24} "
            f"{fit_med[s]:>13.1f} {result['fit_ratio_vs_none'][s]:>8.3f}"
        )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
