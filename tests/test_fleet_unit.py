"""The node fleet without Ray actors: how runs end, and what a run target wants."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ray_wandb_nodes._fleet.collect import CollectJob, OfflineCollection
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.plan import RunWants
from ray_wandb_nodes._fleet.pool import LoggerHandle, LoggerPool
from ray_wandb_nodes._fleet.retire import Retirement, advance_all
from ray_wandb_nodes._fleet.targets import StandaloneTarget
from ray_wandb_nodes._warn import Warner
from ray_wandb_nodes._writers import WriterSpec


def retirement(run_id: str, **fields: Any) -> Retirement:
    return Retirement(
        run_id=run_id, refs={}, deadline=0.0, timeout=1.0, then=None, writers_done=threading.Event(), **fields
    )


def test_a_run_whose_end_fails_does_not_hold_the_other_runs_ends(caplog: pytest.LogCaptureFixture) -> None:
    class RefusingIndex:
        folder = "/nowhere"

        def set_writer(self, entry: dict[str, Any]) -> None:
            raise RuntimeError("the index refused")

    warner = Warner()
    handle = LoggerHandle(node=NodeInfo("a" * 56, "host", "10.0.0.1"), actor=None, pg=None)
    ended: list[str] = []
    # Its collection is over; recording what was left fails.
    job = CollectJob(run_id="run-a", index=RefusingIndex(), role="node", sources=[handle])  # type: ignore[arg-type]
    failing = retirement("run-a", job=job, collecting=True)
    fine = retirement("run-b")
    fine.then = lambda: ended.append("run-b")
    pool = LoggerPool(init_timeout_s=1.0, warner=warner, ping_s=1.0)
    still = advance_all([failing, fine], pool, OfflineCollection(warner), warner, final=False)
    assert ended == ["run-b"] and still == []
    assert "ending the W&B run run-a failed (RuntimeError: the index refused)" in caplog.text
    # Whoever waits on either run's end is released.
    assert failing.writers_done.is_set() and fine.writers_done.is_set()


def test_a_standalone_run_wants_its_one_node_and_is_ready_at_once() -> None:
    spec = WriterSpec(role="run", label="rank-0", init_kwargs={"id": "base-rank-0"}, settings={})
    target = StandaloneTarget(writer=spec, nodes={"n1"})
    assert target.ready and target.role == "run" and target.index is None
    assert target.wants() == RunWants("base-rank-0", "workers", frozenset({"n1"}), None)
    assert target.wants(["n2"]).nodes == frozenset({"n1", "n2"})
    assert target.spec(NodeInfo("n1", "h", "")) is spec
