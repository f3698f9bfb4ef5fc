"""Hangs named live, end to end: a real TorchTrainer over gloo on two nodes, four ranks, one of
which stops after a step's report while the others wait in the next step's all_reduce. Every
rank is armed by the plugin (no user code), the node loggers read the beacons, the evidence is
taken out of band, and the alert, the ``hangs`` table and the stack files reach the test backend
through the real wandb client."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left, node_labels
from tests.support.runs import run_of, unique
from tests.support.training import make_callback, trainer
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster
TOPOLOGY = "two_nodes"
WORLD, STUCK, AT, STEPS = 4, 3, 3, 6
HANG_TIMEOUT_S = 4.0


def load_next_shard(release: str, stuck_at: str) -> None:
    """A data function that stops (a stalled file system, say) until the test releases it."""
    Path(stuck_at).write_text(str(time.time()))
    while not os.path.exists(release):
        time.sleep(0.05)  # <load_next_shard>


def hang_loop(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(config["steps"]):
        if step == config["at"] and rank == config["stuck"]:
            load_next_shard(config["release"], config["stuck_at"])
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)  # <all_reduce>
        optimizer.step()
        ray.train.report({"step": step})


def line_of(marker: str) -> int:
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if f"# <{marker}>" in text:
            return number
    raise AssertionError(marker)


def test_a_rank_stuck_in_python_is_named_live_with_every_ranks_stacks_and_progress_resumes(
    cluster: Any, backend: WandbTestBackend, tmp_path: Path
) -> None:
    from ray.train import RunConfig, ScalingConfig

    name = unique("hang-python")
    release, stuck_at = tmp_path / "release", tmp_path / "stuck_at"
    callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S)
    config = {"steps": STEPS, "at": AT, "stuck": STUCK, "release": str(release), "stuck_at": str(stuck_at)}
    result: dict[str, Any] = {}

    def run() -> None:
        result["fit"] = trainer(
            hang_loop,
            torch=True,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name=name, storage_path=str(tmp_path / "storage"), callbacks=[callback]),
        ).fit()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        alert = wait_until(
            lambda: (
                next((a for a in run_of(backend, name).alerts if a["title"].startswith("Hang:")), None)
                if run_of_or_none(backend, name)
                else None
            ),
            180,
            "the hang alert",
            every_s=0.1,
        )
        seen_s = time.time() - float(stuck_at.read_text())
    finally:
        release.touch()
    thread.join(timeout=180)
    assert not thread.is_alive() and result["fit"].error is None

    labels = node_labels()
    sentence = alert["text"].splitlines()[0]
    print(f"hang alert {seen_s:.1f} s after rank {STUCK} stopped: {alert['title']}\n{alert['text']}")
    assert alert["severity"] == "ERROR" and alert["title"] == f"Hang: rank {STUCK} stopped"
    assert sentence.startswith("ranks 0-2 wait in all_reduce #"), sentence
    assert f"(test_hangs.py:{line_of('all_reduce')})" in sentence
    assert f"rank {STUCK} never entered it: in load_next_shard (test_hangs.py:{line_of('load_next_shard')})" in sentence
    assert any(f"rank {STUCK} on {label}" in alert["text"] for label in labels.values()), alert["text"]
    # The evidence came while the processes lived, within the limit and the detection's cadence.
    assert seen_s < HANG_TIMEOUT_S + 10, seen_s

    run = run_of(backend, name)
    titles = [a["title"] for a in run.alerts if "Hang" in a["title"]]
    assert titles[0] == f"Hang: rank {STUCK} stopped" and len(titles) == 2, titles
    assert titles[1].startswith("Hang over: rank") and titles[1].endswith("progress again"), titles
    (table,) = run.tables("hangs")
    rows = {row["rank"]: row for row in table}
    assert sorted(rows) == list(range(WORLD))
    assert rows[STUCK]["state"] == "stopped" and "load_next_shard" in rows[STUCK]["where"]
    assert {rows[r]["state"] for r in range(WORLD) if r != STUCK} == {"waits"}
    assert {rows[r]["collective"] for r in range(WORLD) if r != STUCK} == {"all_reduce"}
    assert all(rows[r]["last_step"] == AT for r in range(WORLD)), rows  # optimizer steps, no user code
    files = {name for name in run.files if name.startswith("hangs/hang-1/")}
    assert files == {"hangs/hang-1/verdict.txt", *(f"hangs/hang-1/rank-{r}.txt" for r in range(WORLD))}, files
    stuck_file = run.files[f"hangs/hang-1/rank-{STUCK}.txt"].decode()
    assert "TrainingThread(" in stuck_file and "load_next_shard" in stuck_file
    assert "all_reduce" in run.files["hangs/hang-1/rank-0.txt"].decode()
    assert run.completes and run.completes[-1].exit_code == 0
    assert_nothing_left()


def run_of_or_none(backend: WandbTestBackend, name: str) -> Any:
    try:
        return run_of(backend, name)
    except AssertionError:
        return None
