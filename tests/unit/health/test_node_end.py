"""A node that goes away: lost (one ERROR) when it took the run's ranks with it, ``left`` (no
alert) when a restart or a resize had moved them off it first and an autoscaler removed it idle.
Through the monitor, and through the fleet with a node listing as ``ray.nodes()`` gives it."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._health import HealthMonitor, HealthOptions, NodeEnd, NodeState
from ray_wandb_nodes._health.node_judge import LOST_GRACE_S
from tests.support.fakes import Clock

NODES = {"n0": ("node-h0-aaaaaa", "h0"), "n1": ("node-h1-bbbbbb", "h1"), "n2": ("node-h2-cccccc", "h2")}
BEFORE = {"n0": (0,), "n1": (1,)}  # two ranks on n0 and n1
AFTER = {"n0": (0,), "n2": (1,)}  # a restart (or a resize) moved rank 1 from n1 to n2


def restarted(**options: Any) -> tuple[HealthMonitor, Clock]:
    """A run whose restart moved rank 1 off n1 at 1000 s; ``cluster``: n1 stays in the run."""
    cluster = options.pop("cluster", False)
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=2, **options), clock=clock)
    m.set_nodes(NODES, BEFORE)
    m.set_nodes(NODES if cluster else {k: v for k, v in NODES.items() if k != "n1"}, AFTER)
    return m, clock


def states(m: HealthMonitor) -> dict[str, str]:
    return {n.node_id: str(n.state) for n in m.nodes()}


def lost_titles(m: HealthMonitor) -> list[tuple[str, str]]:
    return [(a.title, a.level) for a in m.tick(final=True).alerts]


@pytest.mark.parametrize("cluster", [False, True], ids=["workers", "cluster"])
def test_a_node_removed_idle_after_a_restart_moved_its_ranks_off_is_left_not_lost(cluster: bool) -> None:
    # KubeRay removes a node idle for 60 s; Ray then knows it ended by a SIGTERM or a drain, or
    # (a killed pod) only once its health checks fail, some 15 s or more later.
    m, clock = restarted(cluster=cluster)
    clock.now += 75
    m.alive(["n0", "n2"])  # Ray said nothing of how it ended
    assert lost_titles(m) == []
    assert states(m)["n1"] == "left"
    clock.now += 600
    m.alive(["n0", "n2"], ended={"n1": NodeEnd.CRASHED})  # judged once: never lost later
    assert lost_titles(m) == []


@pytest.mark.parametrize(
    ("end", "after_s", "lost"),
    [
        (NodeEnd.TERMINATED, 65.0, False),  # KubeRay's scale-down: SIGTERM after 60 s idle
        (NodeEnd.IDLE, 5.0, False),  # the autoscaler drained it idle: no rank ran there
        (NodeEnd.TERMINATED, 5.0, True),  # ended by a SIGTERM (a spot VM) as Train restarted around it
        (NodeEnd.PREEMPTED, 20.0, True),
        (NodeEnd.CRASHED, 60.0, True),  # crashed: Ray's health checks took a minute to say so
        (NodeEnd.UNKNOWN, 60.0, True),
        (NodeEnd.CRASHED, 75.0, False),
    ],
)
def test_a_node_gone_within_the_grace_of_how_it_ended_may_have_taken_its_ranks(
    end: NodeEnd, after_s: float, lost: bool
) -> None:
    m, clock = restarted()
    clock.now += after_s
    m.alive(["n0", "n2"], ended={"n1": end})
    if lost:
        alerts = m.tick(final=True).alerts
        assert [(a.title, a.level) for a in alerts] == [("Node lost: node-h1-bbbbbb", "ERROR")]
        assert "rank 1" in alerts[0].text  # the ranks it held before the restart
        assert states(m)["n1"] == "lost"
    else:
        assert lost_titles(m) == []
        assert states(m)["n1"] == "left"
    assert (after_s < LOST_GRACE_S.get(end, 0.0)) is lost  # the table of graces says the same


@pytest.mark.parametrize("end", list(NodeEnd))
def test_a_node_gone_with_the_runs_ranks_on_it_is_lost_however_it_ended(end: NodeEnd) -> None:
    m, clock = restarted()
    clock.now += 3600  # long after the restart: n2 holds rank 1 now
    m.alive(["n0", "n1"], ended={"n2": end})
    assert lost_titles(m) == [("Node lost: node-h2-cccccc", "ERROR")]
    # it dies again in the listing (a later listing, its reason dropped): still one alert
    m.alive(["n0", "n1"])
    assert lost_titles(m) == []


def test_an_observer_that_never_hosted_a_rank_is_left_even_while_in_the_run() -> None:
    # nodes="cluster": a node of the run without ranks, seen gone before the run drops it
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=2), clock=clock)
    m.set_nodes(NODES, BEFORE)
    m.alive(["n0", "n1"], ended={"n2": NodeEnd.CRASHED})
    assert lost_titles(m) == []
    assert states(m)["n2"] == "left"
    m.set_nodes(NODES, BEFORE)  # still listed by the run a moment: a node that left stays left
    assert states(m)["n2"] == "left"


def test_a_tune_trials_node_is_lost_when_it_goes_without_ranks() -> None:
    # compare_all: a trial's nodes run the trial (they hold no Train rank)
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=2, compare_all=True), clock=clock)
    m.set_nodes({"n0": NODES["n0"]}, {})
    m.alive([], ended={"n0": NodeEnd.TERMINATED})
    assert lost_titles(m) == [("Node lost: node-h0-aaaaaa", "ERROR")]


def test_ranks_that_come_back_to_a_node_make_its_death_a_loss_again() -> None:
    m, clock = restarted(cluster=True)
    clock.now += 300
    m.set_nodes(NODES, BEFORE)  # a resize puts rank 1 back on n1
    clock.now += 300
    m.alive(["n0", "n2"], ended={"n1": NodeEnd.TERMINATED})
    assert lost_titles(m) == [("Node lost: node-h1-bbbbbb", "ERROR")]


# Through the fleet: the listing as ray.nodes() gives it (DeathReason 1 is Ray's
# EXPECTED_TERMINATION, "received SIGTERM"; 2 UNEXPECTED_TERMINATION, "health check failed").
HEX = {n: f"{i:056x}" for i, n in enumerate(NODES)}  # node ids as Ray writes them (the simulated actors read them)


class Listing:
    def __init__(self) -> None:
        self.dead: dict[str, int] = {}

    def __call__(self) -> list[dict[str, Any]]:
        return [
            {
                "NodeID": HEX[node_id],
                "Alive": node_id not in self.dead,
                "NodeManagerHostname": host,
                "NodeManagerAddress": "10.0.0.1",
                "Resources": {"CPU": 8.0},
                "DeathReason": self.dead.get(node_id, 0),
                "DeathReasonMessage": "",
            }
            for node_id, (_, host) in NODES.items()
        ]


def test_through_the_fleet_a_node_scaled_down_after_a_restart_is_left_and_one_that_died_with_ranks_lost() -> None:
    from bench.fleet_scale import Quiet, SimCluster, make_target
    from ray_wandb_nodes._fleet.commands import AddRun, Poll, SetNodes
    from ray_wandb_nodes._fleet.fleet import POLL_S, NodeFleet

    clock, listing = Clock(), Listing()
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=listing, actors=SimCluster(0, clock), clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)  # nodes="cluster": every alive node is the run's
    monitor = target.health
    assert monitor is not None
    fleet.step(AddRun(target))
    before, after = ({HEX[n]: r for n, r in ranks.items()} for ranks in (BEFORE, AFTER))
    fleet.step(SetNodes(target.run_id, set(before), ranks=before))
    clock.now += 30
    fleet.step(SetNodes(target.run_id, set(after), ranks=after))  # the restart moves rank 1 off n1
    clock.now += 65  # idle 60 s, then KubeRay deletes its pod: the raylet ends on its SIGTERM
    listing.dead["n1"] = 1
    fleet.step(Poll())
    assert [a.title for a in monitor.raised] == []
    assert {n.node_id: n.state for n in monitor.nodes()}[HEX["n1"]] is NodeState.LEFT
    clock.now += POLL_S
    listing.dead["n2"] = 2  # n2 crashes with rank 1 on it
    fleet.step(Poll())
    label = {n.node_id: n.label for n in monitor.nodes()}[HEX["n2"]]
    assert [(a.title, a.level) for a in monitor.raised] == [(f"Node lost: {label}", "ERROR")]
