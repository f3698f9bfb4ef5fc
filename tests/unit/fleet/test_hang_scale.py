"""Hang alerts at scale, on a simulated clock (``bench/hang_scale.py``: the real fleet, pool,
pings and hang watch over simulated loggers whose pings carry their ranks' beacons): 64 nodes
pinged 4 a tick are pinged as 1,000 are at 64 a tick, each about every 30 s, older than a 30 s
limit. The bench runs the 1,000 nodes for 10 minutes; this proves the mechanism."""

from __future__ import annotations

import pytest

from bench.hang_scale import RANKS, simulate
from ray_wandb_nodes._fleet import pings

NODES, LIMIT_S, STEP_S = 64, 30.0, 5.0


@pytest.fixture(autouse=True)
def pings_as_at_1000_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pings, "PING_BATCH", 4)


def test_a_healthy_job_whose_pings_are_older_than_the_limit_raises_no_hang() -> None:
    r = simulate(NODES, minutes=4, limit_s=LIMIT_S, step_s=STEP_S)
    assert r["ping_interval_s"] > 25  # a reading is as old as a ping is at 1,000 nodes
    assert r["pings_out_of_turn"] > 0  # the suspicions those readings raised were read again
    assert (r["hang_alerts"], r["closing_notices"], r["evidence_rounds"]) == (0, 0, 0)


@pytest.mark.parametrize(
    ("stuck_s", "end"),
    [
        (60.0, "Hang over: ranks "),  # the ranks of the first nodes whose pings see them move
        (0.0, "Hang over: ranks 0-511 progress again"),  # stuck until every rank finished, at the run's end
    ],
)
def test_a_rank_that_stops_is_alerted_once_a_tick_past_its_limit_and_the_hang_is_closed(
    stuck_s: float, end: str
) -> None:
    r = simulate(NODES, minutes=4, limit_s=LIMIT_S, step_s=STEP_S, stuck_s=stuck_s)
    stuck = NODES // 2 * RANKS + 3
    alert, closing = r["titles"]
    assert alert == f"Hang: rank {stuck} stopped" and closing.startswith(end)
    assert r["evidence_rounds"] == 1 and r["nodes_asked"] == NODES
    # Its limit and at most two ticks (1.875 s each: the ping out of turn, its answer) after its
    # last progress, as at 8 nodes: no ping's age on top.
    assert LIMIT_S < r["alert_after_progress_s"] <= LIMIT_S + 2 * 1.875
    assert r["notices_before_primary_finished"] == 2  # the closing notice reached the run before its end


def test_what_the_controller_learns_reaches_the_watch_as_commands_of_the_fleet_thread() -> None:
    """Train's hooks never set the watch's fields from their thread: they queue a command, and the
    fleet thread, which owns the watch, applies it (issue 36: one owner per piece of state)."""
    from bench.fleet_scale import Quiet, SimCluster, make_target
    from ray_wandb_nodes._fleet.commands import AddRun, Checkpointed, RanksFinished
    from ray_wandb_nodes._fleet.fleet import NodeFleet
    from ray_wandb_nodes._fleet.hangs import HangWatch
    from ray_wandb_nodes._hang import HangTimeout
    from tests.support.fakes import Clock

    clock = Clock()
    sim = SimCluster(2, clock)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.hangs = watch = HangWatch(HangTimeout(seconds=30), clock=clock)
    fleet.step(AddRun(target))
    fleet.ranks_finished(target.run_id, frozenset({1}))  # from a hook: queued, nothing changed yet
    fleet.checkpointed(target.run_id, 4)
    assert watch.finished == frozenset() and watch.checkpoint_reports == 0
    while not fleet._commands.empty():  # the fleet thread's turns
        fleet.step(fleet._commands.get())
    assert watch.finished == frozenset({1}) and watch.checkpoint_reports == 4
    fleet.step(RanksFinished("another-run", frozenset({0})))  # another run's: not this watch's
    fleet.step(Checkpointed(target.run_id, 0))  # an attempt starts
    assert watch.finished == frozenset({1}) and watch.checkpoint_reports == 0
