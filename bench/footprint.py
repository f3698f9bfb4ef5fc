"""Footprint of one node writer: the NodeLogger actor plus the wandb processes under it.

    python -m bench.footprint [--window-s 60] [--json bench/results/footprint.json]

A simulated cluster (a CPU-less head, one one-CPU worker node), the W&B test backend, and a
one-worker TorchTrainer that reports every 0.5 s for long enough that the node writer on
the worker node runs ``--window-s`` seconds after it joined, at the default sampling interval
(15 s). Every second the logger's process tree is read from /proc: resident memory (RSS),
proportional memory (PSS: shared pages split among the processes that map them) and CPU
time, per process. An idle Ray actor on the same node is sampled too: the floor any actor
costs before it does anything.
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
from bench._procs import TreeSampler


def train_loop(config: dict[str, Any]) -> None:

    import ray.train

    deadline = time.monotonic() + config["duration_s"]
    step = 0
    while time.monotonic() < deadline:
        time.sleep(0.5)
        ray.train.report({"step": step, "loss": 1.0 / (step + 1)})
        step += 1


class Idle:
    def ping(self) -> int:
        return os.getpid()


def window(series: list[tuple[float, dict[str, tuple[float, float, float]]]], settle_s: float, length_s: float) -> Any:
    """The samples from ``settle_s`` after wandb-core first appears, ``length_s`` long."""
    joined = next((t for t, parts in series if any("wandb-core" in name for name in parts)), None)
    if joined is None:
        return []
    start = joined + settle_s
    return [(t, parts) for t, parts in series if start <= t <= start + length_s]


def summarise(samples: list[tuple[float, dict[str, tuple[float, float, float]]]]) -> dict[str, Any]:
    totals = [(t, *(sum(p[i] for p in parts.values()) for i in range(3))) for t, parts in samples]
    span = totals[-1][0] - totals[0][0]
    names = sorted({name for _, parts in samples for name in parts})
    return {
        "seconds": span,
        "samples": len(samples),
        "rss_mib_max": max(x[1] for x in totals),
        "rss_mib_mean": statistics.mean(x[1] for x in totals),
        "pss_mib_max": max(x[2] for x in totals),
        "pss_mib_mean": statistics.mean(x[2] for x in totals),
        "cpu_pct_of_core": 100 * (totals[-1][3] - totals[0][3]) / span if span > 0 else float("nan"),
        "by_process": {
            name: {
                "rss_mib_mean": statistics.mean(parts[name][0] for _, parts in samples if name in parts),
                "pss_mib_mean": statistics.mean(parts[name][1] for _, parts in samples if name in parts),
                "cpu_pct_of_core": 100
                * (samples[-1][1].get(name, (0, 0, 0))[2] - samples[0][1].get(name, (0, 0, 0))[2])
                / span
                if span > 0
                else float("nan"),
            }
            for name in names
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--json", default="bench/results/footprint.json")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_wandb_nodes import WandbNodesCallback

    sampler = TreeSampler("ray::NodeLogger")
    idle_sampler = TreeSampler("ray::Idle")
    with simulated_cluster(worker_nodes=1):
        worker_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU"))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        idle = (
            ray.remote(Idle)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(worker_node, soft=False))
            .remote()
        )
        ray.get(idle.ping.remote())
        sampler.start()
        idle_sampler.start()
        trainer = TorchTrainer(
            train_loop,
            # start-up of the writer (~10 s here) + settling + the window + a margin
            train_loop_config={"duration_s": args.window_s + args.settle_s + 25},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(
                name=f"footprint-{uuid.uuid4().hex[:6]}",
                storage_path=os.path.join(WORK_DIR, "results"),
                callbacks=[WandbNodesCallback(project="bench")],  # default sampling interval
            ),
        )
        trainer.fit()
        sampler.stop.set()
        idle_sampler.stop.set()

    interval = WandbNodesCallback(project="bench").options.sampling_interval_s  # the default
    loggers = [s for s in sampler.samples.values() if s]
    if len(loggers) != 1:
        print(f"expected one NodeLogger process, sampled {len(loggers)} (did it restart?)", file=sys.stderr)
        return 1
    samples = window(loggers[0], args.settle_s, args.window_s)
    if not samples:
        print("the node writer never started wandb-core: nothing to measure", file=sys.stderr)
        return 1
    logger = summarise(samples)
    # The idle actor over the same seconds as the writer.
    start, end = samples[0][0], samples[-1][0]
    floor = summarise([(t, p) for t, p in next(iter(idle_sampler.samples.values())) if start <= t <= end])
    result = {
        "node_writer": logger,
        "idle_ray_actor": floor,
        "sampling_interval_s": interval,
        "target": "RSS < 150 MB and CPU < 1 % of a core",
    }
    print(f"one node writer over {logger['seconds']:.0f} s after it joined (default sampling interval, {interval:g} s)")
    print(f"{'process':<22} {'RSS MiB':>8} {'PSS MiB':>8} {'CPU % core':>11}")
    for name, p in logger["by_process"].items():
        print(f"{name:<22} {p['rss_mib_mean']:>8.1f} {p['pss_mib_mean']:>8.1f} {p['cpu_pct_of_core']:>11.2f}")
    print(
        f"{'total (mean / max)':<22} {logger['rss_mib_mean']:>8.1f} {logger['pss_mib_mean']:>8.1f} "
        f"{logger['cpu_pct_of_core']:>11.2f}   max RSS {logger['rss_mib_max']:.1f}, max PSS {logger['pss_mib_max']:.1f}"
    )
    print(
        f"{'idle Ray actor (floor)':<22} {floor['rss_mib_mean']:>8.1f} {floor['pss_mib_mean']:>8.1f} "
        f"{floor['cpu_pct_of_core']:>11.2f}"
    )
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
