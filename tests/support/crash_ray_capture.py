"""Capture what Ray Train V2's controller sees when a rank fails, for the unit tests of the first
death: four ranks (TorchTrainer, gloo) on two nodes of a local cluster, one scenario a fit with
``max_failures=0``; a probe callback reads each poll with errors through ``_ray.failures.poll_of``
(the plugin's own reader) and every rank's train function is armed with the plugin's hook
(``_ray.failures.hook_train_errors``), its records written under the scenario's folder. Ray's
memory monitor is captured on a plain actor (a Train worker runs no task while it trains, so the
monitor's choice of it cannot be forced here): its ``OutOfMemoryError`` read as Train's poll wraps it.

    flock /tmp/rwn-e2e.lock python -m tests.support.crash_ray_capture OUT.json [SCENARIO ...]

Scenarios: ``raise`` (rank 1 raises while the others wait in all_reduce), ``kill`` (rank 1
SIGKILLs itself), ``lost`` (the node of ranks 2 and 3 is killed), ``oom`` (the memory monitor).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

import ray
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback

from ray_wandb_nodes._failure import RankRecorder, read_records
from ray_wandb_nodes._ray.failures import hook_train_errors, poll_of, rank_error

ROOT = Path(tempfile.gettempdir()) / "rwn-crash-ray"


class Probe(ControllerCallback, WorkerGroupCallback):  # type: ignore[misc]
    def __init__(self, out: str) -> None:
        self.out, self.group, self.polls = out, None, 0

    def write(self, **event: Any) -> None:
        with open(self.out, "a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.group = worker_group
        workers = worker_group.get_workers()
        self.write(event="placements", ranks=[{"rank": w.distributed_context.world_rank, "pid": w.metadata.pid,
                                               "node": w.metadata.node_id} for w in workers])  # fmt: skip

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        self.polls += 1
        if worker_group_status.errors:
            self.write(event="poll", n=self.polls, poll=asdict(poll_of(worker_group_status, self.group)))

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        self.write(event="decision", decision=failure_decision.value)


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    hook_train_errors(RankRecorder(Path(config["records"]), rank).raised)
    for step in range(60):
        if step == 3 and rank == 1 and config["scenario"] == "raise":
            raise ValueError("bad shard 17")
        if step == 3 and rank == 1 and config["scenario"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(4))
        ray.train.report({"step": step})
        time.sleep(0.1)


def fit(cluster: Any, scenario: str, doomed: Any) -> dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    events, records = ROOT / f"{scenario}.jsonl", ROOT / scenario
    records.mkdir(parents=True, exist_ok=True)
    events.unlink(missing_ok=True)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"scenario": scenario, "records": str(records)},
        scaling_config=ScalingConfig(num_workers=4),
        run_config=RunConfig(name=f"crash-{scenario}-{time.time():.0f}", storage_path=str(ROOT / "storage"),
                             callbacks=[Probe(str(events))], failure_config=FailureConfig(max_failures=0)),
    )  # fmt: skip
    error: list[str] = []
    thread = threading.Thread(target=lambda: _fit(trainer, error))
    thread.start()
    if scenario == "lost":
        while not events.exists() or "placements" not in events.read_text():
            time.sleep(0.2)
        time.sleep(2.0)  # a few steps in
        cluster.remove_node(doomed, allow_graceful=False)
    thread.join()
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    poll = next(e for e in lines if e["event"] == "poll")
    return {"scenario": scenario, "ray": ray.__version__, "doomed_node": doomed.node_id,
            "placements": next(e for e in lines if e["event"] == "placements")["ranks"], "poll": poll["poll"],
            "decision": next(e["decision"] for e in lines if e["event"] == "decision"), "fit_error": error[:1],
            "records": [json.loads(r.to_json()) for r in read_records(records)]}  # fmt: skip


def _fit(trainer: Any, error: list[str]) -> None:
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001
        error.append(type(e).__name__)


@ray.remote(num_cpus=1, max_restarts=0)
class Hog:
    def hog(self, mb: int) -> int:
        block = bytearray(mb * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(60)
        return len(block)

    def poll(self) -> str:
        return "running"


def memory_monitor() -> dict[str, Any]:
    """A plain actor killed by Ray's memory monitor (threshold: 15% of the machine, the hog 3 GB
    past whatever else runs), its next call's error as Train's poll wraps it."""
    from ray.cluster_utils import Cluster
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    monitor = {"memory_usage_threshold": 0.15, "memory_monitor_refresh_ms": 250}
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": monitor}
    )
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.add_node(num_cpus=1)
    try:
        hog = Hog.remote()  # type: ignore[attr-defined]
        try:
            ray.get(hog.hog.remote(3000), timeout=120)
            raise AssertionError("the memory monitor did not kill the hog")
        except ray.exceptions.OutOfMemoryError:
            pass
        try:
            ray.get(hog.poll.remote(), timeout=60)
            raise AssertionError("the killed actor answered")
        except Exception as e:  # noqa: BLE001 - as the worker group's poll catches it
            wrapped = WorkerHealthCheckFailedError("A worker health check failed.", failure=e)
            return {"scenario": "oom", "ray": ray.__version__, "error": asdict(rank_error(1, wrapped))}
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    from ray.cluster_utils import Cluster

    out, scenarios = Path(sys.argv[1]), sys.argv[2:] or ["raise", "kill", "lost", "oom"]
    captured = []
    trains = [s for s in scenarios if s != "oom"]
    if trains:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.add_node(num_cpus=2)
        doomed = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        try:
            captured += [fit(cluster, s, doomed) for s in trains]
        finally:
            ray.shutdown()
            cluster.shutdown()
    if "oom" in scenarios:
        captured.append(memory_monitor())
    out.write_text(json.dumps(captured, indent=1) + "\n")


if __name__ == "__main__":
    main()
