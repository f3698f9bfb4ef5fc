"""Tune experiment time with and without WandbNodesTuneCallback, side by side.

    python -m bench.tune_overhead [--rounds 2] [--trials 3] [--iterations 10]

A local simulated cluster (a CPU-less head and one one-CPU node per trial) and the
W&B-compatible test backend on 127.0.0.1; experiments with and without the callback
alternate, the first of each round taking turns, so both see the same machine state. Prints
a table and writes JSON.
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
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--json", default="bench/results/tune_overhead.json")
    args = parser.parse_args()

    from ray_wandb_nodes import WandbNodesTuneCallback

    times: dict[str, list[float]] = {"none": [], "callback": []}
    with simulated_cluster(worker_nodes=args.trials) as (_, backend):
        experiment(args.trials, 2, None)  # warm-up
        for r in range(args.rounds):
            for setup in ("none", "callback") if r % 2 == 0 else ("callback", "none"):
                callback = WandbNodesTuneCallback(project="bench") if setup == "callback" else None
                times[setup].append(experiment(args.trials, args.iterations, callback))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "trials": args.trials,
        "iterations": args.iterations,
        "experiment_s": times,
        "median_s": med,
        "ratio_callback_over_none": med["callback"] / med["none"],
        "runs_seen": len(backend.runs),
    }
    print(f"{'configuration':<14} {'median s':>9} {'all runs (s)':>24}")
    for key in ("none", "callback"):
        print(f"{key:<14} {med[key]:>9.2f} {', '.join(f'{t:.2f}' for t in times[key]):>24}")
    print(f"ratio callback/none: {result['ratio_callback_over_none']:.3f}")
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
