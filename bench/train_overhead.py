"""Training speed with no logging, with WandbNodesCallback, and with a rank-0 ``wandb.init``
inside the train loop, side by side on a local simulated cluster.

    python -m bench.train_overhead [--rounds 4] [--steps 75] [--json bench/results/train_overhead.json]

A CPU-less head and two one-CPU worker nodes (each a real raylet), the W&B test backend on
127.0.0.1, and a two-worker TorchTrainer (DDP over gloo) whose loop does a torch step of about
half a second on one core and ``ray.train.report``s every step. (Train V2's controller takes
one report per health-check interval, 0.2 s here and 2 s by default, and a worker's next
report waits for it: steps shorter than the interval would measure Ray, not the logging.)
Rank 0 times each step after a warm-up (the first 25 steps: start-up, node writers joining) and
writes the times to a file; steps per second are over those steps, and also from their median
step, which a burst on this shared machine moves less. The three set-ups run interleaved, in a
rotating order, ``--rounds`` times; ratios are of medians. The whole ``fit()`` is timed too
(start-up and the end included).
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

from bench._harness import WORK_DIR, simulated_cluster, write_result

# Steps left out of the timing: start-up (node writers join in the first ~10 s here).
WARMUP_STEPS = 25


def train_loop(config: dict[str, Any]) -> None:
    import json
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
    torch.set_num_threads(1)  # one CPU per worker
    width = 1024  # three of these make a step of about half a second on one core
    model = prepare_model(
        torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    durations = []
    for step in range(config["steps"]):
        started = time.perf_counter()
        for _ in range(3):
            x = torch.randn(512, width)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        metrics = {"step": step, "loss": float(loss)}
        if run is not None:
            run.log(metrics)
        ray.train.report(metrics)
        durations.append(time.perf_counter() - started)  # the step, its logging and its report
    if rank == 0:
        # Train V2 keeps only the metrics of reports with a checkpoint: hand the figures over
        # in a file (the simulated cluster shares this machine's disk).
        with open(config["out"], "w") as f:
            json.dump(durations[WARMUP_STEPS:], f)
    if run is not None:
        run.finish()


def fit_once(setup: str, steps: int, storage: str) -> tuple[float, float, float]:
    """Rank 0's steps per second over the timed steps and from their median step, and the
    seconds of the whole fit."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback

    name = f"bench-{setup}-{uuid.uuid4().hex[:6]}"
    callbacks = [WandbNodesCallback(project="bench")] if setup == "callback" else []
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "steps": steps,
            "rank0_wandb": setup == "rank0_wandb_init",
            "name": name,
            "out": os.path.join(WORK_DIR, f"{name}.steps.json"),
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks),
    )
    started = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - started
    with open(os.path.join(WORK_DIR, f"{name}.steps.json")) as f:
        durations = json.load(f)
    return len(durations) / sum(durations), 1 / statistics.median(durations), seconds


SETUPS = ["none", "callback", "rank0_wandb_init"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=75)
    parser.add_argument("--json", default="bench/results/train_overhead.json")
    args = parser.parse_args()

    storage = os.path.join(WORK_DIR, "results")
    rates: dict[str, list[float]] = {s: [] for s in SETUPS}
    median_rates: dict[str, list[float]] = {s: [] for s in SETUPS}
    fits: dict[str, list[float]] = {s: [] for s in SETUPS}
    with simulated_cluster(worker_nodes=2):
        fit_once("none", WARMUP_STEPS + 5, storage)  # warm-up: imports, worker processes
        for r in range(args.rounds):
            order = SETUPS[r % 3 :] + SETUPS[: r % 3]
            for setup in order:
                rate, median_rate, seconds = fit_once(setup, args.steps, storage)
                rates[setup].append(rate)
                median_rates[setup].append(median_rate)
                fits[setup].append(seconds)
                print(
                    f"  round {r + 1} {setup:<17} {rate:6.3f} steps/s ({median_rate:6.3f} from the median step)"
                    f"   fit {seconds:5.1f} s",
                    flush=True,
                )

    med = {s: statistics.median(v) for s, v in rates.items()}
    med_step = {s: statistics.median(v) for s, v in median_rates.items()}
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
        "steps_per_s_from_median_step": median_rates,
        "ratio_vs_none_from_median_step": {s: med_step[s] / med_step["none"] for s in SETUPS},
        "fit_ratio_vs_none": {s: fit_med[s] / fit_med["none"] for s in SETUPS},
        "target": "callback within 2 % of none (steps/s)",
    }
    print()
    print(
        f"{'set-up':<17} {'steps/s':>7} {'vs none':>7} {'rounds':>22} {'median-step rate':>16} {'vs none':>7} "
        f"{'fit s':>6} {'vs none':>7}"
    )
    for s in SETUPS:
        spread = ", ".join(f"{x:.2f}" for x in rates[s])
        print(
            f"{s:<17} {med[s]:>7.3f} {result['ratio_vs_none'][s]:>7.3f} {spread:>22} {med_step[s]:>16.3f} "
            f"{result['ratio_vs_none_from_median_step'][s]:>7.3f} {fit_med[s]:>6.1f} "
            f"{result['fit_ratio_vs_none'][s]:>7.3f}"
        )
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
