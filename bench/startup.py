"""Start-up: how long until every node writer has joined, for 1, 2 and 4 nodes, and what the
plugin adds before the first training step.

    python -m bench.startup [--nodes 1 2 4] [--rounds 2] [--json bench/results/startup.json]

For each node count N: a simulated cluster of a CPU-less head (driver and Train controller)
and N one-CPU worker nodes, the W&B test backend, and an N-worker TorchTrainer. Times are
from the ``fit()`` call: the primary's first ``UpsertBucket`` (the run exists), the last node
writer's first ``UpsertBucket`` (every node writer joined; the backend timestamps each), and
rank 0's first training step. Runs with and without the callback alternate.
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


def train_loop(config: dict[str, Any]) -> None:
    import time

    import ray.train

    if ray.train.get_context().get_world_rank() == 0:
        # The first step starts now. Train V2 keeps only the metrics of reports with a
        # checkpoint: hand the time over in a file (the simulated cluster shares this disk).
        with open(config["out"], "w") as f:
            f.write(repr(time.time()))
    for step in range(config["steps"]):
        time.sleep(0.5)
        ray.train.report({"step": step})


def fit_once(nodes: int, with_callback: bool, backend: Any, storage: str, steps: int) -> dict[str, float | None]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback

    name = f"startup-{nodes}-{uuid.uuid4().hex[:6]}"
    callbacks = [WandbNodesCallback(project="bench")] if with_callback else []
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"steps": steps, "out": os.path.join(WORK_DIR, f"{name}.first")},
        scaling_config=ScalingConfig(num_workers=nodes),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks),
    )
    t0 = time.time()
    trainer.fit()
    with open(os.path.join(WORK_DIR, f"{name}.first")) as f:
        first_step_at = float(f.read())
    out: dict[str, float | None] = {
        "first_step_s": first_step_at - t0,
        "fit_s": time.time() - t0,
        "run_created_s": None,
        "all_joined_s": None,
        "writers": None,
    }
    if with_callback:
        (run,) = [r for r in backend.runs.values() if r.display_name == name]
        firsts: dict[str | None, float] = {}
        for t, client in run.upsert_times:
            firsts.setdefault(client, t)
        times = sorted(firsts.values())
        out.update(run_created_s=times[0] - t0, all_joined_s=times[-1] - t0, writers=float(len(times)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="training steps of 0.5 s, long enough for every join")
    parser.add_argument("--json", default="bench/results/startup.json")
    args = parser.parse_args()

    storage = os.path.join(WORK_DIR, "results")
    rows = []
    for nodes in args.nodes:
        runs: dict[str, list[dict[str, float | None]]] = {"none": [], "callback": []}
        with simulated_cluster(worker_nodes=nodes) as (_, backend):
            fit_once(nodes, False, backend, storage, 2)  # warm-up: imports, worker processes
            for r in range(args.rounds):
                for setup in ["none", "callback"] if r % 2 == 0 else ["callback", "none"]:
                    m = fit_once(nodes, setup == "callback", backend, storage, args.steps)
                    runs[setup].append(m)
                    print(f"  {nodes} node(s) round {r + 1} {setup:<8} {m}", flush=True)

        def med(setup: str, key: str, runs: dict[str, list[dict[str, float | None]]] = runs) -> float:
            return statistics.median(float(m[key]) for m in runs[setup] if m[key] is not None)

        rows.append(
            {
                "nodes": nodes,
                "writers": med("callback", "writers"),
                "run_created_s": med("callback", "run_created_s"),
                "all_joined_s": med("callback", "all_joined_s"),
                "all_joined_s_runs": [m["all_joined_s"] for m in runs["callback"]],
                "first_step_s_none": med("none", "first_step_s"),
                "first_step_s_callback": med("callback", "first_step_s"),
                "first_step_runs": {k: [m["first_step_s"] for m in v] for k, v in runs.items()},
                "added_before_first_step_s": med("callback", "first_step_s") - med("none", "first_step_s"),
            }
        )

    print()
    print(
        f"{'nodes':>5} {'writers':>7} {'run created s':>13} {'all joined s':>12} "
        f"{'1st step s: none':>16} {'callback':>9} {'added s':>8}"
    )
    for r in rows:
        print(
            f"{r['nodes']:>5} {r['writers']:>7.0f} {r['run_created_s']:>13.2f} {r['all_joined_s']:>12.2f} "
            f"{r['first_step_s_none']:>16.2f} {r['first_step_s_callback']:>9.2f} {r['added_before_first_step_s']:>8.2f}"
        )
    result = {
        "rows": rows,
        "rounds": args.rounds,
        "target": "writers start in parallel (4 nodes ~ 1 node); nothing added before the first step",
    }
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
