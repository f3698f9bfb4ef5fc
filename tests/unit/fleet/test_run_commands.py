"""What a run's hooks (and its primary's thread) learn reaches the fleet thread as a command, and
only the fleet thread changes the run's target: each command, stepped on a simulated fleet, does
what it says to the target (a table: command -> what the target holds after); a command for a
target that is no longer the run's changes nothing; what a run learns from elsewhere (a Train run
inside a Tune trial) is a ``Relayed`` value the fleet thread applies; the one thing the hooks read
back, ``wants_report``, is set and cleared by the fleet thread."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from bench.fleet_scale import Clock, Quiet, SimCluster, make_target
from ray_wandb_nodes._config.values import OnHang
from ray_wandb_nodes._fleet import HangSetting, HangWatch, Relayed, RunProcess, SharedTarget
from ray_wandb_nodes._fleet.commands import (
    AddRun,
    Checkpointed,
    Command,
    EndHealth,
    Located,
    Poll,
    RankReport,
    RanksFinished,
    RunReady,
    SetNodes,
)
from ray_wandb_nodes._fleet.fleet import NodeFleet
from ray_wandb_nodes._fleet.targets import relayed_nodes
from ray_wandb_nodes._hang import HangTimeout
from ray_wandb_nodes._warn import Warner


def fleet_with_run(ready: bool = True) -> tuple[NodeFleet, SharedTarget, list[str]]:
    """A simulated fleet of two nodes serving one shared run armed for hangs, and its node ids."""
    clock = Clock()
    sim = SimCluster(2, clock)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.ready = ready
    target.hangs = HangWatch(HangTimeout(seconds=4.0))  # built before AddRun: the fleet's from then on
    fleet.step(AddRun(target))
    return fleet, target, list(sim.alive)


# command (for the run's id, and its target) -> what the target holds once the fleet thread took it
CASES: dict[str, tuple[Callable[[str, SharedTarget], Command], Callable[[SharedTarget], Any], Any]] = {
    "RunReady: its node writers may join": (lambda rid, t: RunReady(t), lambda t: t.ready, True),
    "SetNodes: its nodes, covered node, ranks, their GPUs and attempt": (
        lambda rid, t: SetNodes(rid, {"n1"}, "n0", None, {"n1": (0, 1)}, {0: ("0",), 1: ("1",)}, "a.1"),
        lambda t: (t.nodes, t.covered_node, t.ranks, t.rank_gpus, t.attempt),
        ({"n1"}, "n0", {"n1": (0, 1)}, {0: ("0",), 1: ("1",)}, "a.1"),
    ),
    "Located: its own process, for the writer on its node": (
        lambda rid, t: Located(rid, RunProcess("n1", 4242), t),
        lambda t: t.process,
        RunProcess("n1", 4242),
    ),
    "EndHealth: no node health any more, nothing waited for": (
        lambda rid, t: EndHealth(rid),
        lambda t: (t.health, t.wants_report.is_set()),
        (None, False),
    ),
    "RanksFinished: its hang watch leaves those ranks": (
        lambda rid, t: RanksFinished(rid, frozenset({1})),
        lambda t: t.hangs.finished if t.hangs else None,
        frozenset({1}),
    ),
    "Checkpointed: a hang's place counts reports from there": (
        lambda rid, t: Checkpointed(rid, 7),
        lambda t: t.hangs.checkpoint_reports if t.hangs else None,
        7,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_command_changes_the_target_on_the_fleet_thread(case: str) -> None:
    fleet, target, _ = fleet_with_run(ready=False)
    make, read, expected = CASES[case]
    assert read(target) != expected  # not so before the command
    fleet.step(make(target.run_id, target))
    assert read(target) == expected


@pytest.mark.parametrize("case", ["SetNodes", "Located"])
def test_a_command_for_a_target_no_longer_the_runs_changes_nothing(case: str) -> None:
    fleet, target, _ = fleet_with_run()
    old = make_target(Clock())  # a target of the same run id the fleet no longer holds (a restarted trial's)
    command = {
        "SetNodes": SetNodes(target.run_id, {"n9"}, None, old),
        "Located": Located(target.run_id, RunProcess("n9", 1), old),
    }[case]
    fleet.step(command)
    assert target.nodes == set() and target.process is None


def test_the_fleet_thread_applies_what_a_run_learns_from_elsewhere() -> None:
    told: list[Relayed] = [
        Relayed({"n1": (0,)}),  # the Train run inside the trial placed its ranks; no hang setting yet
        Relayed({"n1": (0,), "n2": (1,)}, "t.a1", HangSetting(HangTimeout(seconds=4.0), OnHang.RESTART, 600.0)),
        Relayed({"n2": (1,)}, "t.a2", HangSetting(HangTimeout(seconds=4.0), OnHang.RESTART, 600.0), frozenset({1}), 3),
    ]
    target = make_target(Clock())
    target.relay = lambda: told[0]
    warner = Warner()
    assert relayed_nodes(target, warner) == {"n1"}
    assert target.hangs is None and target.attempt is None  # not watched: no setting came
    told.pop(0)
    assert relayed_nodes(target, warner) == {"n1", "n2"}
    watch = target.hangs
    assert watch is not None and (watch.setting, watch.on_hang, watch.pg_timeout_s) == (
        HangTimeout(4.0),
        OnHang.RESTART,
        600.0,
    )
    assert watch.ranks == {"n1": (0,), "n2": (1,)} and target.attempt == "t.a1"
    told.pop(0)
    assert relayed_nodes(target, warner) == {"n2"}
    assert target.hangs is watch  # one watch for the run, across its attempts
    assert (watch.ranks, watch.finished, watch.checkpoint_reports, target.attempt) == ({"n2": (1,)}, {1}, 3, "t.a2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        told[0].attempt = "x"  # type: ignore[misc]


def test_a_relay_that_cannot_be_read_adds_no_node_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    def unreadable() -> Relayed:
        raise ConnectionError("the GCS is unreachable")

    target = make_target(Clock())
    target.relay = unreadable
    warner = Warner()
    assert relayed_nodes(target, warner) == () and relayed_nodes(target, warner) == ()
    assert caplog.text.count("could not read more nodes (ConnectionError: the GCS is unreachable)") == 1


def test_wants_report_is_set_by_the_fleet_while_its_ranks_have_not_reported_and_cleared_by_their_report() -> None:
    fleet, target, nodes = fleet_with_run()
    fleet.step(Poll())
    assert not target.wants_report.is_set()  # no ranks placed: no report awaited
    fleet.step(SetNodes(target.run_id, set(nodes), None, None, {nodes[0]: (0,)}, {0: ("0",)}))
    assert target.wants_report.is_set()  # the ranks of a new placement: their first report is awaited
    fleet.step(RankReport(target.run_id, [], 100.0))
    assert not target.wants_report.is_set()
    fleet.step(EndHealth(target.run_id))
    fleet.step(SetNodes(target.run_id, set(nodes), None, None, {nodes[1]: (1,)}, {1: ("0",)}))
    assert not target.wants_report.is_set()  # no node health: nothing awaited
