"""A replaced replica group (Ray 2.56+) gets node writers where its new workers run, and its
frameworks' own W&B logging is turned off as every worker group's is.

With a backend that manages replica groups (TorchFT's, in Ray), a failing worker is replaced
alone: Ray calls ``after_replica_group_start`` for the new worker and no worker-group hook.
Here the node under rank 1 is removed mid-run; its replacement lands on a spare node, which
must then appear in the run with its own label. The backend below is a ``TorchConfig`` whose
backend manages replica groups, as TorchFT's does, without TorchFT itself. Every worker starts
Accelerate's W&B tracker (whose ``wandb.init`` runs on whichever rank starts it), the workers
set up for W&B as on a user's cluster: no worker, the replacement included, makes a run of it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from tests.support.cluster import node_labels, said_by_workers
from tests.support.env import worker_env
from tests.support.runs import assert_one_writer_per_label, run_of, unique, user_rows
from tests.support.training import make_callback
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

try:
    from ray.train.v2._internal.execution.callback import ReplicaGroupCallback  # noqa: F401
except ImportError:
    pytest.skip("replica groups come with Ray 2.56", allow_module_level=True)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


# The cluster: tests/e2e/conftest.py's three_nodes fixture.
TOPOLOGY = "three_nodes"


def until_stopped(config: dict[str, Any]) -> None:
    """Reports until rank 0 has reported ``steps`` times. A replacement worker starts this function
    afresh, so the ranks stop together on a file rather than on a count."""
    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    os.environ.update(config["worker_env"])  # W&B reachable from the workers, as on a user's cluster
    from accelerate import PartialState
    from accelerate.tracking import WandBTracker

    PartialState()  # what Accelerator() sets up first (the tracker logs through it)
    WandBTracker(os.environ["WANDB_PROJECT"]).start()  # a framework's own wandb.init, on every start
    with open(os.path.join(config["dir"], f"rank-{rank}"), "w") as f:
        f.write(ray.get_runtime_context().get_node_id())
    stop = os.path.join(config["dir"], "stop")
    step = 0
    while True:
        if rank == 0 and step >= config["steps"]:
            open(stop, "w").close()  # before the report: every rank sees it after this round
        ray.train.report({"step": step, "rank": rank})
        if os.path.exists(stop):
            return
        step += 1
        time.sleep(0.5)


def replica_group_torch_config() -> Any:
    from ray.train.torch.config import TorchConfig, _TorchBackend
    from ray.train.v2._internal.execution.worker_group import ReplicaGroup

    class PerReplicaTorchBackend(_TorchBackend):  # type: ignore[misc]
        has_replica_groups = True

        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            parent = super().on_start
            if isinstance(worker_group, ReplicaGroup):
                parent(worker_group, backend_config)
            else:
                for group in worker_group.get_replica_groups():
                    parent(group, backend_config)

    class PerReplicaTorchConfig(TorchConfig):  # type: ignore[misc]
        @property
        def backend_cls(self) -> type:
            return PerReplicaTorchBackend

    return PerReplicaTorchConfig(backend="gloo")


def test_a_replaced_replica_group_on_a_new_node_gets_a_writer(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    name, own = unique("replica"), unique("replica-own")
    labels = node_labels()
    placement = tmp_path / "placement"
    placement.mkdir()
    callback = make_callback(project="replicas")
    trainer = TorchTrainer(
        until_stopped,
        train_loop_config={"dir": str(placement), "steps": 40, "worker_env": worker_env(backend, own, tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "storage"),
            callbacks=[callback],
            failure_config=FailureConfig(max_failures=3),
        ),
        torch_config=replica_group_torch_config(),
    )
    first: dict[str, str] = {}

    def both_nodes_write() -> bool:
        runs = [r for r in backend.runs.values() if r.display_name == name]
        return bool(runs) and (placement / "rank-1").exists() and len(runs[0].labels) == 3

    def remove_rank1_node() -> None:
        # Once both workers' nodes write to the run, the node under rank 1 goes, without warning.
        wait_until(both_nodes_write, 120, "both workers' nodes to write to the run")
        first["rank1"] = (placement / "rank-1").read_text()
        node = next(n for n in cluster.worker_nodes if n.node_id == first["rank1"])
        cluster.remove_node(node, allow_graceful=False)

    remover = threading.Thread(target=remove_rank1_node, daemon=True)
    remover.start()
    result = trainer.fit()
    remover.join(timeout=5)
    assert result.error is None
    assert "rank1" in first, "rank 1's node was never removed"
    spare = (placement / "rank-1").read_text()
    assert spare != first["rank1"] and spare in labels, "the replacement did not land on the spare node"

    run = run_of(backend, name)
    # The spare node, where only the replaced replica group ran, has its own series in the run.
    assert labels[spare] in run.labels, (sorted(run.labels), labels[spare])
    assert labels[first["rank1"]] in run.labels
    assert_one_writer_per_label(run)
    assert [c.exit_code for c in run.completes] == [0]
    steps = [row["step"] for row in user_rows(run)]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # rank 0's reports, each once
    # Accelerate's tracker made no run, in the replacement's process either; each process said so once.
    assert backend.runs_in(own) == []
    said = 'Accelerate\'s W&B tracker (log_with="wandb") on rank {} was turned off: it would write a second W&B run '
    said += f"beside this job's run {run.run_id},"
    assert [said_by_workers(cluster, said.format(rank)) for rank in (0, 1)] == [1, 2]
    cluster.add_node(num_cpus=1)  # the next test (if any) finds the cluster as it was
    cluster.wait_for_nodes()
