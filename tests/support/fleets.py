"""Fleets without Ray for the unit tests: a logger pool whose Ray calls answer at once, and the real
fleet over ``bench/fleet_scale.py``'s simulated nodes and loggers on a clock the test moves."""

from __future__ import annotations

from typing import Any

from ray_wandb_nodes._fleet.commands import AddRun
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.pool import LoggerHandle, LoggerPool
from ray_wandb_nodes._warn import Warner


class InstantActors:
    """The pool's Ray calls, answered at once (no Ray)."""

    def group_prefix(self) -> str:
        return "g-"

    def create(self, node_id: str, name: str) -> tuple[None, None]:
        return None, None

    def result(self, ref: Any) -> Any:
        return ref


def one_node_pool() -> tuple[NodeInfo, LoggerPool, LoggerHandle]:
    """A logger pool with one started logger on node ``n1``, and that logger's handle."""
    node = NodeInfo("n1", "host-1", "10.0.0.1")
    pool = LoggerPool(init_timeout_s=1.0, warner=Warner(), ping_s=1.0, actors=InstantActors())  # type: ignore[arg-type]
    pool.start([node])
    handle = pool.get("n1")
    assert handle is not None
    return node, pool, handle


def simulated_fleet(n: int, cap: int = 256) -> tuple[Any, Any, Any]:
    """The fleet thread's ``NodeFleet`` over ``n`` simulated nodes, its cluster and the run it serves
    (``cap``: the run's writer cap), the run added."""
    from bench.fleet_scale import Quiet, SimCluster, make_target
    from ray_wandb_nodes._fleet.fleet import NodeFleet
    from tests.support.fakes import Clock

    clock = Clock()
    sim = SimCluster(n, clock)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.max_writers = cap
    fleet.step(AddRun(target))
    return fleet, sim, target
