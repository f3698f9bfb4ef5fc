"""The job's janitor: each watched controller's placement groups removed once it is dead, and the
janitor's own end once its job has ended (the GCS's tables faked; the real janitor of a killed
controller: ``tests/e2e/test_faults.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes import _ray
from ray_wandb_nodes._fleet import janitor as janitor_module
from ray_wandb_nodes._fleet.janitor import JOB_CHECK_S, LoggerJanitor, group_prefix


class Gcs:
    """What the janitor reads: actors' states, the plugin's placement groups, the jobs."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.groups: list[str] = []
        self.job_dead = False
        self.job_reads = 0

    def actor_state(self, actor_id: str) -> dict[str, Any] | None:
        return {"State": self.states[actor_id]} if actor_id in self.states else None

    def remove_placement_groups(self, prefix: str) -> int:
        gone = [g for g in self.groups if g.startswith(prefix)]
        self.groups = [g for g in self.groups if g not in gone]
        return len(gone)

    def job_ended(self, job_id: str) -> bool:
        assert job_id == "02000000"
        self.job_reads += 1
        return self.job_dead


@pytest.fixture
def gcs(monkeypatch: pytest.MonkeyPatch) -> Gcs:
    fake = Gcs()
    for name in ("actor_state", "remove_placement_groups", "job_ended"):
        monkeypatch.setattr(_ray, name, getattr(fake, name))
    monkeypatch.setattr(janitor_module, "CHECK_S", 3600.0)  # its own thread never turns in a test
    return fake


def test_a_dead_controllers_groups_go_and_the_live_ones_stay(gcs: Gcs) -> None:
    janitor = LoggerJanitor("02000000", "ctl-a")  # the fleet that started it: watched from the start
    gcs.states = {"ctl-a": "ALIVE", "ctl-b": "ALIVE"}
    gcs.groups = [f"{group_prefix('ctl-a')}{i}" for i in range(3)] + [f"{group_prefix('ctl-b')}0"]
    assert janitor.watching() == ["ctl-a"]
    janitor.watch("ctl-b")
    assert janitor.turn(0.0) is False and len(gcs.groups) == 4
    gcs.states["ctl-a"] = "DEAD"
    assert janitor.turn(1.0) is False
    assert gcs.groups == [f"{group_prefix('ctl-b')}0"] and janitor.removed == 3
    assert janitor.watching() == ["ctl-b"]
    # An owner the GCS no longer lists is as dead; one released (its run ended) is not watched.
    janitor.watch("ctl-c")
    gcs.groups.append(f"{group_prefix('ctl-c')}0")
    janitor.release("ctl-b")
    janitor.turn(2.0)
    assert gcs.groups == [f"{group_prefix('ctl-b')}0"] and janitor.watching() == []


def test_it_ends_once_its_job_has_ended_and_reads_the_job_table_only_when_idle_and_rarely(gcs: Gcs) -> None:
    janitor = LoggerJanitor("02000000")
    start = janitor._job_read
    gcs.states = {"ctl-a": "ALIVE"}
    janitor.watch("ctl-a")
    gcs.job_dead = True  # not read while it watches an owner
    assert janitor.turn(start + 10 * JOB_CHECK_S) is False and gcs.job_reads == 0
    janitor.release("ctl-a")
    gcs.job_dead = False
    assert janitor.turn(start + 10 * JOB_CHECK_S) is False and gcs.job_reads == 1
    gcs.job_dead = True
    assert janitor.turn(start + 10.5 * JOB_CHECK_S) is False and gcs.job_reads == 1  # read once a JOB_CHECK_S
    assert janitor.turn(start + 11 * JOB_CHECK_S) is True and gcs.job_reads == 2
