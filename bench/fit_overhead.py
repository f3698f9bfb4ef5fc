"""Fit time with and without WandbNodesCallback, and the footprint of one node logger.

    python bench/fit_overhead.py [--rounds 3] [--reports 20] [--json out.json]

Starts a local simulated cluster (a CPU-less head and two one-CPU worker nodes) and a
W&B-compatible backend on 127.0.0.1 (the test backend), then runs a two-worker
TorchTrainer that reports every step, alternating runs without and with the callback
so both see the same machine state. While the callback runs, it samples the resident
memory (RSS) and CPU time of every NodeLogger actor's process tree (the actor plus the
wandb-core and wandb-symon processes under it) from /proc (Linux only).
Prints a table and writes the raw figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
from _harness import WORK_DIR, simulated_cluster

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch

    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(config["reports"]):
        x = torch.randn(128, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ray.train.report({"step": step, "loss": float(loss)})


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry)] = (ppid, cmd)
    return table


def _tree(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p, (ppid, _) in table.items() if ppid == pid)
    return out


def _rss_and_cpu(pids: list[int]) -> tuple[float, float]:
    rss = cpu = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
                cpu += (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            continue
    return rss / 2**20, cpu


class LoggerSampler(threading.Thread):
    """Samples every NodeLogger process tree once a second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: dict[int, list[tuple[float, float, float]]] = {}  # root pid -> (t, rss MiB, cpu s)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            table = _proc_table()
            for pid, (_, cmd) in table.items():
                if cmd.startswith("ray::NodeLogger"):
                    rss, cpu = _rss_and_cpu(_tree(pid, table))
                    self.samples.setdefault(pid, []).append((time.monotonic(), rss, cpu))

    def summary(self) -> dict[str, float]:
        peaks = [max(s[1] for s in series) for series in self.samples.values() if series]
        cpu_pct = [
            100 * (series[-1][2] - series[0][2]) / (series[-1][0] - series[0][0])
            for series in self.samples.values()
            if len(series) > 1 and series[-1][0] > series[0][0]
        ]
        return {
            "loggers_seen": len(self.samples),
            "rss_mib_peak_max": max(peaks) if peaks else float("nan"),
            "rss_mib_peak_mean": statistics.mean(peaks) if peaks else float("nan"),
            "cpu_pct_mean": statistics.mean(cpu_pct) if cpu_pct else float("nan"),
        }


def fit_once(reports: int, callback: Any, storage: str) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"reports": reports},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=f"bench-{uuid.uuid4().hex[:8]}", storage_path=storage, callbacks=[callback] if callback else []
        ),
    )
    started = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reports", type=int, default=20)
    parser.add_argument("--sampling-interval-s", type=float, default=15.0)
    parser.add_argument("--json", default="bench/results/fit_overhead.json")
    args = parser.parse_args()

    from ray_wandb_nodes import WandbNodesCallback

    storage = os.path.join(WORK_DIR, "results")
    times: dict[str, list[float]] = {"none": [], "callback": []}
    sampler = LoggerSampler()
    with simulated_cluster(worker_nodes=2):
        sampler.start()
        try:
            fit_once(2, None, storage)  # warm-up: imports, worker processes
            for _ in range(args.rounds):
                times["none"].append(fit_once(args.reports, None, storage))
                cb = WandbNodesCallback(project="bench", sampling_interval_s=args.sampling_interval_s)
                times["callback"].append(fit_once(args.reports, cb, storage))
        finally:
            sampler.stop.set()

    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "reports_per_fit": args.reports,
        "rounds": args.rounds,
        "fit_s": times,
        "median_fit_s": med,
        "ratio_callback_over_none": med["callback"] / med["none"],
        "node_logger": sampler.summary(),
        "machine": f"{os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
    }
    print(f"{'configuration':<14} {'median fit s':>12} {'all runs (s)':>30}")
    for key in ("none", "callback"):
        print(f"{key:<14} {med[key]:>12.2f} {', '.join(f'{t:.2f}' for t in times[key]):>30}")
    print(f"ratio callback/none: {result['ratio_callback_over_none']:.3f}")
    nl = result["node_logger"]
    print(
        f"node logger (actor + wandb processes): {nl['loggers_seen']} seen, peak RSS "
        f"{nl['rss_mib_peak_mean']:.0f} MiB mean / {nl['rss_mib_peak_max']:.0f} MiB max, "
        f"CPU {nl['cpu_pct_mean']:.1f} % of a core"
    )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
