"""End to end: the logging strategies, rank metrics and checkpoint artifacts.

A CPU-less head and two worker nodes, one with two CPUs and one with one, so three train
workers put two ranks on one node. Each rank writes where it ran to a file: the ground
truth the assertions compare with.
"""

from __future__ import annotations

import json
import math
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left, node_labels, node_logger_count
from tests.support.runs import unique, user_rows
from tests.support.training import fit_loop, report
from tests.support.training import make_callback as callback_with_test_settings
from tests.support.wait import wait_until
from tests.support.wandb_backend import RunRecord, WandbTestBackend

pytestmark = pytest.mark.cluster

# The cluster: tests/e2e/conftest.py's nodes_of_two_and_one_cpus fixture.
TOPOLOGY = "nodes_of_two_and_one_cpus"

REPORTS = 4
WORKERS = 3
SCORES = [3, 7, 5, 1]  # rank 0's score per step; "best" (max) is step 1


def loop(config: dict[str, Any]) -> None:
    import os
    import time

    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["placement_dir"], f"rank-{rank}"), "w") as f:
        f.write(ray.get_runtime_context().get_node_id())
    # No pause a step: the plugin's start hold has every node sampled before this function starts.
    for step in range(REPORTS):
        if step == REPORTS - 1 and config.get("hold_file"):  # the test says when to end (its ceiling: 120 s)
            ends = time.monotonic() + 120
            while not os.path.exists(config["hold_file"]) and time.monotonic() < ends:
                time.sleep(0.1)
        metrics: dict[str, Any] = {"step": step, "rank": rank, "score": SCORES[step] + 100 * rank, "phase": "train"}
        if rank == 1:
            metrics["only_rank1"] = step
        report(metrics, checkpoint_step=step if config.get("checkpoint") and rank == 0 else None)
        time.sleep(config.get("step_sleep_s", 0))


def fit(
    tmp_path: Path,
    callback: Any,
    *,
    checkpoint: bool = False,
    run_config: dict[str, Any] | None = None,
    step_sleep_s: float = 0.0,
    name: str | None = None,
    hold_file: str | None = None,
) -> str:
    name = name or unique("strategy")
    placement = tmp_path / "placement"
    placement.mkdir(exist_ok=True)
    fit_loop(
        loop, name, callback, str(tmp_path / "storage"), workers=WORKERS, run_config=run_config, succeed=True,
        placement_dir=str(placement), checkpoint=checkpoint, step_sleep_s=step_sleep_s, hold_file=hold_file,
    )  # fmt: skip
    return name


def placement(tmp_path: Path) -> dict[int, str]:
    """rank -> node id, as the ranks themselves saw it."""
    return {int(p.name.split("-")[1]): p.read_text() for p in (tmp_path / "placement").iterdir()}


make_callback = partial(callback_with_test_settings, project="strategies")


def group_runs(backend: WandbTestBackend, group: str) -> dict[str, RunRecord]:
    return {r.display_name or "": r for r in backend.runs.values() if r.group == group}


def test_node_strategy_one_run_per_node_with_its_lowest_rank(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    name = fit(tmp_path, make_callback(strategy="node", upload_checkpoints=True), checkpoint=True)
    ranks = placement(tmp_path)
    labels = node_labels()
    lowest = {node: min(r for r, n in ranks.items() if n == node) for node in set(ranks.values())}
    runs = group_runs(backend, name)
    assert set(runs) == {labels[node] for node in lowest}
    for node, rank in lowest.items():
        run = runs[labels[node]]
        rows = user_rows(run)
        assert [row["rank"] for row in rows] == [rank] * REPORTS
        assert [row["score"] for row in rows] == [s + 100 * rank for s in SCORES]
        assert [row["training_iteration"] for row in rows] == list(range(1, REPORTS + 1))
        assert run.labels == {labels[node]}
        assert run.exit_codes == [0] and len(run.client_ids) == 1
        # Rank 0's checkpoints: artifacts of its node's run, built and uploaded in that node's logger.
        steps = [str(s).encode() for s in range(REPORTS)] if rank == 0 else []
        assert [a.files.get("step") for a in run.models] == steps and all(a.committed for a in run.models)
    assert_nothing_left()


def test_all_strategy_one_run_per_rank(cluster: Any, backend: WandbTestBackend, tmp_path: Path) -> None:
    # The start hold is the shared run's: a rank's own run (its writer created as the rank is
    # placed) samples once it has started, which on a loaded machine may come after a short
    # loop's end. So the ranks hold before their last report until every rank's run holds a
    # sample (an event: the backend's, written to a file the loop reads).
    name, hold = unique("strategy"), tmp_path / "sampled"

    def sampled() -> None:
        ranks = {f"rank-{r}" for r in range(WORKERS)}

        def every_rank_sampled() -> bool:
            return ranks <= {label for label, run in group_runs(backend, name).items() if run.labels}

        wait_until(every_rank_sampled, 120, "a sample a rank")
        hold.touch()

    watcher = threading.Thread(target=sampled, daemon=True)
    watcher.start()
    fit(tmp_path, make_callback(strategy="all"), name=name, hold_file=str(hold))
    watcher.join(5)
    assert hold.exists()
    runs = group_runs(backend, name)
    assert set(runs) == {f"rank-{r}" for r in range(WORKERS)}
    for rank in range(WORKERS):
        run = runs[f"rank-{rank}"]
        rows = user_rows(run)
        assert [row["rank"] for row in rows] == [rank] * REPORTS
        assert [row["score"] for row in rows] == [s + 100 * rank for s in SCORES]
        assert ("only_rank1" in rows[0]) == (rank == 1)
        assert run.labels == {f"rank-{rank}"}
        assert run.exit_codes == [0] and len(run.client_ids) == 1
        assert run.config["ray_train"]["value"]["rank"] == rank
    assert_nothing_left()


def test_main_strategy_one_run_no_node_writer_and_every_rank_prefixed(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    loggers_before = node_logger_count()
    name = fit(tmp_path, make_callback(strategy="main", rank_metrics="all", nodes="cluster"))
    runs = [r for r in backend.runs.values() if r.display_name == name]
    assert len(runs) == 1
    run = runs[0]
    assert run.labels == {node_labels()[str(cluster.head_node.node_id)]}
    assert node_logger_count() == loggers_before
    rows = user_rows(run)
    for rank in range(WORKERS):
        assert [row[f"rank_{rank}/score"] for row in rows] == [s + 100 * rank for s in SCORES]
    assert [row["rank_1/only_rank1"] for row in rows] == list(range(REPORTS))
    assert "rank_0/only_rank1" not in rows[0]
    assert run.exit_codes == [0] and len(run.client_ids) == 1


def test_reduce_logs_the_reductions_and_local_checkpoints_are_uploaded_with_best_at_the_best(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    # One fit for both: checkpoints add no history row, and the best alias is scored on what
    # rank 0 reported (Ray's checkpoint_score_attribute), not on the reduced row.
    from ray.train import CheckpointConfig

    name = fit(
        tmp_path,
        make_callback(rank_metrics="reduce", upload_checkpoints=True),
        checkpoint=True,
        run_config={
            "checkpoint_config": CheckpointConfig(checkpoint_score_attribute="score", checkpoint_score_order="max")
        },
    )
    run = next(r for r in backend.runs.values() if r.display_name == name)
    rows = user_rows(run)
    assert len(rows) == REPORTS
    for step, row in enumerate(rows):
        scores = [SCORES[step] + 100 * r for r in range(WORKERS)]
        mean = sum(scores) / WORKERS
        assert row["score/mean"] == pytest.approx(mean)
        assert row["score/min"] == min(scores) and row["score/max"] == max(scores)
        assert row["score/std"] == pytest.approx(math.sqrt(sum((s - mean) ** 2 for s in scores) / WORKERS))
        assert row["score/argmax_rank"] == WORKERS - 1 and row["score/argmin_rank"] == 0
        # A key only one rank reports reduces over that rank alone; strings stay as rank 0's.
        assert (row["only_rank1/mean"], row["only_rank1/std"], row["only_rank1/argmax_rank"]) == (step, 0, 1)
        assert row["phase"] == "train"
        assert "score" not in row
    assert run.labels == set(node_labels().values())
    # Every checkpoint uploaded, the best alias on the best one.
    arts = run.models
    assert [a.files.get("step") for a in arts] == [str(s).encode() for s in range(REPORTS)]
    assert all(a.type == "model" and a.committed and a.name == f"checkpoint-{run.run_id}" for a in arts)
    assert all("latest" in a.aliases for a in arts)
    best = [a for a in arts if "best" in a.aliases][-1]  # W&B moves an alias to its newest holder
    assert best.files["step"] == str(SCORES.index(max(SCORES))).encode()
    assert run.exit_codes == [0]


def test_checkpoints_on_a_non_local_filesystem_become_references(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    import pyarrow.fs as pafs

    root = tmp_path / "remote"
    root.mkdir()
    remote = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    name = fit(
        tmp_path,
        make_callback(upload_checkpoints=True),
        checkpoint=True,
        run_config={"storage_filesystem": remote, "storage_path": "storage"},
    )
    run = next(r for r in backend.runs.values() if r.display_name == name)
    assert len(run.models) == REPORTS
    for a in run.models:
        assert a.files == {}  # nothing uploaded
        (uri,) = a.references.values()
        assert uri.startswith("subtree://") and f"/{name}/checkpoint_" in uri
    # The references point at what Ray wrote.
    written = sorted(
        p.name for p in (root / "storage" / name).iterdir() if p.is_dir() and p.name.startswith("checkpoint_")
    )
    assert sorted(next(iter(a.references.values())).rsplit("/", 1)[1] for a in run.models) == written
    assert json.dumps(run.config)  # the run config stays serialisable
