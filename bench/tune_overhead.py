"""Tune experiment time with no logger, with WandbNodesTuneCallback and with Ray's own
WandbLoggerCallback, side by side in one run.

    python -m bench.tune_overhead [--rounds 3] [--trials 4] [--iterations 10] [--nodes 1] [--cpus 2]

A local simulated cluster (a CPU-less head and ``--nodes`` worker nodes of ``--cpus`` CPUs: by
default one node running 2 trials at a time) and the W&B-compatible test backend on
127.0.0.1; each trial reports ``--iterations`` times, 0.1 s apart (1 s trials). The three set-ups
run in turn, the order rotating each round, so all see the same machine state. Prints a table
and writes JSON. Target: the plugin within 5 % of no logging.

Beside the wall time, each logger's hooks are timed where Tune runs them (its driver's loop): the
milliseconds a trial's start, result and end and the experiment's end hold that loop. That figure
is far less noisy than the wall time on a shared machine; the wall time also holds what the
loggers' threads and processes take from the CPUs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from typing import Any

from bench._harness import WORK_DIR, simulated_cluster, write_result

# setup -> hook -> milliseconds each call held Tune's loop
HOOK_MS: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
HOOKS = {
    "on_trial_start": "trial start",
    "on_trial_result": "trial result",
    "on_trial_complete": "trial end",
    "on_trial_error": "trial end",
    "on_experiment_end": "experiment end",
}


def timed(base: type, setup: str) -> type:
    """``base`` with each of its Tune hooks timed into ``HOOK_MS[setup]`` (a class at module
    level, so that Tune can copy and pickle its instances)."""

    def hook(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return getattr(base, name)(self, *args, **kwargs)
            finally:
                HOOK_MS[setup][HOOKS[name]].append(1000 * (time.perf_counter() - started))

        return method

    cls = type(f"Timed{base.__name__}", (base,), {name: hook(name) for name in HOOKS})
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


def hook_table(trials: int, rounds: int) -> dict[str, dict[str, float]]:
    """setup -> per hook its median ms, and the ms per trial all hooks held Tune's loop."""
    out: dict[str, dict[str, float]] = {}
    for setup, by_hook in HOOK_MS.items():
        row = {f"{hook} median ms": statistics.median(v) for hook, v in by_hook.items() if v}
        row.update({f"{hook} max ms": max(v) for hook, v in by_hook.items() if v})
        row["all hooks ms per trial"] = sum(sum(v) for v in by_hook.values()) / (trials * rounds)
        out[setup] = row
    return out


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
    plugin, ray_cb = timed(WandbNodesTuneCallback, "plugin"), timed(WandbLoggerCallback, "ray")
    make = {
        "none": lambda: None,
        "plugin": lambda: plugin(project="bench"),
        "ray": lambda: ray_cb(project="bench"),
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
        "hooks": hook_table(args.trials, args.rounds),
    }
    print(f"{'configuration':<26} {'median s':>9} {'vs none':>8} {'all runs (s)':>24}")
    names = {"none": "no logger", "plugin": "WandbNodesTuneCallback", "ray": "Ray's WandbLoggerCallback"}
    for key in setups:
        runs = ", ".join(f"{t:.2f}" for t in times[key])
        print(f"{names[key]:<26} {med[key]:>9.2f} {med[key] / med['none']:>7.3f}x {runs:>24}")
    print("\nTune's loop held by the hooks (ms; median of the calls, and all hooks' sum per trial)")
    cols = ("trial start", "trial result", "trial end", "experiment end")
    print(f"{'configuration':<26} " + " ".join(f"{c:>14}" for c in cols) + f" {'per trial':>10}")
    for key in ("plugin", "ray"):
        row = result["hooks"].get(key, {})
        cells = " ".join(f"{row.get(f'{c} median ms', float('nan')):>14.2f}" for c in cols)
        print(f"{names[key]:<26} {cells} {row.get('all hooks ms per trial', float('nan')):>10.2f}")
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
