"""Start-up and end: when each node's first sample comes, against when its train workers enter
the training function, for 1, 2 and 4 nodes; what the plugin adds before the first step and
after the last report.

    python -m bench.startup [--nodes 1 2 4] [--rounds 2] [--json bench/results/startup.json]

For each node count N: a simulated cluster of a CPU-less head (driver and Train controller)
and N one-CPU worker nodes, the W&B test backend, and an N-worker TorchTrainer at the default
sampling interval (15 s). Times are from the ``fit()`` call: the run's creation (the primary's
first ``UpsertBucket``), every node writer joined (the last writer's first ``UpsertBucket``),
each worker node's first system sample (its first labelled row, by the sample's own time)
against the moment the train workers on that node entered the training function ("lead": the
entry less the first sample; positive means the sample came first), rank 0's first step, and
the end: from rank 0's last report to ``fit()`` returning. Runs with and without the callback
alternate.
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
from tests.support.cluster import node_labels


def train_loop(config: dict[str, Any]) -> None:
    import json
    import time

    import ray
    import ray.train

    entered = time.time()
    rank = ray.train.get_context().get_world_rank()
    node_id = ray.get_runtime_context().get_node_id()
    for step in range(config["steps"]):
        time.sleep(0.5)
        ray.train.report({"step": step})
    # Train V2 keeps only the metrics of reports with a checkpoint: hand the times over in a
    # file (the simulated cluster shares this disk).
    with open(f"{config['out']}.{rank}", "w") as f:
        json.dump({"entered": entered, "node_id": node_id, "last_report": time.time()}, f)


def fit_once(nodes: int, with_callback: bool, backend: Any, storage: str, steps: int) -> dict[str, Any]:
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
    returned = time.time()
    ranks = []
    for rank in range(nodes):
        with open(os.path.join(WORK_DIR, f"{name}.first.{rank}")) as f:
            ranks.append(json.load(f))
    out: dict[str, Any] = {
        "first_step_s": ranks[0]["entered"] - t0,
        "end_s": returned - ranks[0]["last_report"],
        "fit_s": returned - t0,
        "run_created_s": None,
        "all_joined_s": None,
        "writers": None,
        "first_sample_s": None,
        "lead_s": None,
    }
    if with_callback:
        (run,) = [r for r in backend.runs.values() if r.display_name == name]
        firsts: dict[str | None, float] = {}
        for t, client in run.upsert_times:
            firsts.setdefault(client, t)
        times = sorted(firsts.values())
        out.update(run_created_s=times[0] - t0, all_joined_s=times[-1] - t0, writers=float(len(times)))
        labels = node_labels()
        first_sample = first_samples(run)
        entries: dict[str, float] = {}
        for r in ranks:
            entries[r["node_id"]] = min(entries.get(r["node_id"], r["entered"]), r["entered"])
        samples = {n: first_sample.get(labels.get(n, "?")) for n in entries}
        out["first_sample_s"] = {n[:8]: (t - t0 if t else None) for n, t in samples.items()}
        out["lead_s"] = {n[:8]: (entries[n] - t if t else None) for n, t in samples.items()}
    return out


def first_samples(run: Any) -> dict[str, float]:
    """label -> the time of its first system sample (the row's own timestamp)."""
    out: dict[str, float] = {}
    for row in run.events:
        for key in row:
            if "/l:" in key:
                label = key.rsplit("/l:", 1)[1]
                out[label] = min(out.get(label, row["_timestamp"]), row["_timestamp"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="training steps of 0.5 s, long enough for every join")
    parser.add_argument("--json", default="bench/results/startup.json")
    args = parser.parse_args()

    storage = os.path.join(WORK_DIR, "results")
    rows: list[dict[str, Any]] = []
    for nodes in args.nodes:
        runs: dict[str, list[dict[str, Any]]] = {"none": [], "callback": []}
        with simulated_cluster(worker_nodes=nodes) as (_, backend):
            fit_once(nodes, False, backend, storage, 2)  # warm-up: imports, worker processes
            for r in range(args.rounds):
                for setup in ["none", "callback"] if r % 2 == 0 else ["callback", "none"]:
                    m = fit_once(nodes, setup == "callback", backend, storage, args.steps)
                    runs[setup].append(m)
                    print(f"  {nodes} node(s) round {r + 1} {setup:<8} {m}", flush=True)

        def med(setup: str, key: str, runs: dict[str, list[dict[str, Any]]] = runs) -> float:
            return statistics.median(float(m[key]) for m in runs[setup] if m[key] is not None)

        leads = [v for m in runs["callback"] for v in (m["lead_s"] or {}).values()]
        rows.append(
            {
                "nodes": nodes,
                "writers": med("callback", "writers"),
                "run_created_s": med("callback", "run_created_s"),
                "all_joined_s": med("callback", "all_joined_s"),
                "first_sample_s_runs": [m["first_sample_s"] for m in runs["callback"]],
                "lead_s_runs": [m["lead_s"] for m in runs["callback"]],
                # the worst node over every run: the sample must come first (lead >= 0)
                "min_lead_s": min((v for v in leads if v is not None), default=None),
                "nodes_without_sample": sum(v is None for v in leads),
                "first_step_s_none": med("none", "first_step_s"),
                "first_step_s_callback": med("callback", "first_step_s"),
                "added_before_first_step_s": med("callback", "first_step_s") - med("none", "first_step_s"),
                "end_s_none": med("none", "end_s"),
                "end_s_callback": med("callback", "end_s"),
                "added_at_end_s": med("callback", "end_s") - med("none", "end_s"),
                "end_runs": {k: [m["end_s"] for m in v] for k, v in runs.items()},
            }
        )

    print()
    print(
        f"{'nodes':>5} {'writers':>7} {'all joined s':>12} {'min lead s':>10} "
        f"{'1st step s: none':>16} {'callback':>9} {'added':>6} {'end s: none':>11} {'callback':>9} {'added':>6}"
    )
    for r in rows:
        lead = "n/a" if r["min_lead_s"] is None else f"{r['min_lead_s']:.2f}"
        print(
            f"{r['nodes']:>5} {r['writers']:>7.0f} {r['all_joined_s']:>12.2f} {lead:>10} "
            f"{r['first_step_s_none']:>16.2f} {r['first_step_s_callback']:>9.2f} "
            f"{r['added_before_first_step_s']:>6.2f} "
            f"{r['end_s_none']:>11.2f} {r['end_s_callback']:>9.2f} {r['added_at_end_s']:>6.2f}"
        )
    result = {
        "rows": rows,
        "rounds": args.rounds,
        "target": "each node's first sample before its workers enter the train function (lead >= 0); "
        "the end adds at most 1 s",
    }
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
