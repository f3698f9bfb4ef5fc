"""Tune experiment time with no logger, with WandbNodesTuneCallback and with Ray's own
WandbLoggerCallback, side by side in one run.

    python -m bench.tune_overhead [--rounds 3] [--trials 4] [--iterations 10] [--nodes 1] [--cpus 2]

A local simulated cluster (a CPU-less head and ``--nodes`` worker nodes of ``--cpus`` CPUs: by
default one node running 2 trials at a time) and the W&B-compatible test backend on
127.0.0.1; each trial reports ``--iterations`` times, 0.1 s apart (1 s trials). The three set-ups
run in turn, the order rotating each round, so all see the same machine state. Prints a table
and writes JSON. Target: the plugin within 5 % of no logging.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

from bench._harness import WORK_DIR, simulated_cluster, write_result


def trainable(config: dict[str, Any]) -> None:
    import time

    from ray import tune

    for i in range(config["iterations"]):
        time.sleep(0.1)
        tune.report({"score": i})


def experiment(trials: int, iterations: int, callback: Any) -> float:
    from ray import tune

    started = time.perf_counter()
    tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search(list(range(trials))), "iterations": iterations},
        run_config=tune.RunConfig(
            name=f"bench-{uuid.uuid4().hex[:6]}",
            storage_path=os.path.join(WORK_DIR, "tune"),
            callbacks=[callback] if callback else [],
            verbose=0,
        ),
    ).fit()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--json", default="bench/results/tune_overhead.json")
    args = parser.parse_args()

    from ray.air.integrations.wandb import WandbLoggerCallback

    from ray_wandb_nodes import WandbNodesTuneCallback

    setups = ("none", "plugin", "ray")
    make = {
        "none": lambda: None,
        "plugin": lambda: WandbNodesTuneCallback(project="bench"),
        "ray": lambda: WandbLoggerCallback(project="bench"),
    }
    times: dict[str, list[float]] = {k: [] for k in setups}
    with simulated_cluster(worker_nodes=args.nodes, cpus_per_node=args.cpus) as (_, backend):
        experiment(args.trials, 2, None)  # warm-up
        for r in range(args.rounds):
            for setup in setups[r % 3 :] + setups[: r % 3]:
                times[setup].append(experiment(args.trials, args.iterations, make[setup]()))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "trials": args.trials,
        "iterations": args.iterations,
        "nodes": args.nodes,
        "cpus_per_node": args.cpus,
        "experiment_s": times,
        "median_s": med,
        "ratio_plugin_over_none": med["plugin"] / med["none"],
        "ratio_ray_over_none": med["ray"] / med["none"],
        "runs_seen": len(backend.runs),
    }
    print(f"{'configuration':<26} {'median s':>9} {'vs none':>8} {'all runs (s)':>24}")
    names = {"none": "no logger", "plugin": "WandbNodesTuneCallback", "ray": "Ray's WandbLoggerCallback"}
    for key in setups:
        runs = ", ".join(f"{t:.2f}" for t in times[key])
        print(f"{names[key]:<26} {med[key]:>9.2f} {med[key] / med['none']:>7.3f}x {runs:>24}")
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
