"""Which attempt folders each node logger watches (``_fleet/watches.py``): a table of what the runs
want, then the real fleet (``NodeFleet`` over ``bench/fleet_scale.py``'s simulated nodes and
loggers) past the writer cap: a straggler's node promoted from observer to member keeps its ranks
watched throughout, a restarted logger is asked again, a new attempt replaces the old one's watch
and a run's end lets its folder go."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bench.fleet_scale import Quiet, make_target
from ray_wandb_nodes._config.values import NodeSelection
from ray_wandb_nodes._fleet import worker as fleet_worker
from ray_wandb_nodes._fleet.commands import AddRun, Poll, Retire, SetNodes
from ray_wandb_nodes._fleet.fleet import NodeFleet
from ray_wandb_nodes._fleet.hangs import HangWatch
from ray_wandb_nodes._fleet.plan import observer_key
from ray_wandb_nodes._fleet.targets import SharedTarget, StandaloneTarget
from ray_wandb_nodes._fleet.watches import wanted_watches
from ray_wandb_nodes._hang import HangTimeout
from tests.support.fakes import Clock
from tests.support.recording import RecordingCluster

ONE, TWO = "run.a1.0000000d", "run.a2.0000000d"


def shared(ranks: dict[str, tuple[int, ...]], attempt: str | None = ONE, hangs: bool = True, **kw: Any) -> Any:
    target = SharedTarget.__new__(SharedTarget)  # the fields wanted_watches reads, no primary
    target.ranks, target.attempt, target.covered_node = ranks, attempt, kw.get("covered")
    target.hangs = HangWatch(HangTimeout(seconds=30.0), ranks=kw.get("relayed")) if hangs else None
    target.relayed_ranks = kw.get("relayed")
    return target


CASES = [
    ("each node watches its ranks, by the attempt's key", [shared({"a": (0, 1), "b": (2,)})],
     ({"a": {ONE: (0, 1)}, "b": {ONE: (2,)}}, {})),
    ("the fleet's own node is read by the fleet", [shared({"a": (1,), "head": (0,)}, covered="head")],
     ({"a": {ONE: (1,)}}, {ONE: (0,)})),
    ("no hang detection: its ranks still watched, for how they end", [shared({"a": (0,)}, hangs=False)],
     ({"a": {ONE: (0,)}}, {})),
    ("no attempt yet (ranks not armed): nothing watched", [shared({"a": (0,)}, attempt=None)], ({}, {})),
    ("a Train run inside a Tune trial: the ranks it published", [shared({"t": (0,)}, relayed={"b": (0, 1)})],
     ({"b": {ONE: (0, 1)}}, {})),
    ("... with no hang detection as well", [shared({"t": (0,)}, hangs=False, relayed={"b": (0, 1)})],
     ({"b": {ONE: (0, 1)}}, {})),
    ("two runs on one node: one folder each", [shared({"a": (0,)}), shared({"a": (0, 1)}, attempt=TWO)],
     ({"a": {ONE: (0,), TWO: (0, 1)}}, {})),
]  # fmt: skip


@pytest.mark.parametrize(("targets", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_the_runs_want_watched(targets: list[Any], expected: Any) -> None:
    assert wanted_watches(targets) == expected


def test_a_standalone_run_watches_nothing() -> None:
    target = StandaloneTarget.__new__(StandaloneTarget)
    target.ranks, target.attempt, target.covered_node = {"a": (0,)}, ONE, None
    assert wanted_watches([target]) == ({}, {})


def test_past_the_cap_a_promoted_stragglers_ranks_stay_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    sim = RecordingCluster(3, clock)
    a, b, c = sorted(sim.alive)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.health, target.max_writers, target.selection = None, 2, NodeSelection.WORKERS
    target.hangs = HangWatch(HangTimeout(seconds=30.0))
    stragglers: set[str] = set()
    monkeypatch.setattr(fleet_worker, "stragglers", lambda t: frozenset(stragglers))
    fleet.step(AddRun(target))
    ranks = {a: (0, 1), b: (2, 3), c: (4, 5)}
    fleet.step(SetNodes(target.run_id, set(ranks), ranks=ranks, attempt=ONE))
    calls = sim.taken("add_writer", "watch", "unwatch")
    assert {(n, args[0].run_id) for n, name, args in calls if name == "add_writer"} == {
        (a, "scale-run"), (b, "scale-run"), (c, observer_key("scale-run"))
    }  # fmt: skip
    assert sorted((n, args) for n, name, args in calls if name != "add_writer") == [
        (node, (ONE, ranks[node])) for node in (a, b, c)
    ]  # every node's ranks, members' (a, b) and the observer's (c) alike

    stragglers.add(c)  # c straggles: it takes the place of b, the least-needed member
    fleet.worker.dirty = True
    clock.now += 3.0
    fleet.step(Poll())
    writers = sim.taken("add_writer", "finish", "watch", "unwatch")
    assert {(n, name) for n, name, _ in writers} == {(b, "finish"), (b, "add_writer"), (c, "finish"), (c, "add_writer")}
    assert {(n, args[0].run_id) for n, name, args in writers if name == "add_writer"} == {
        (b, observer_key("scale-run")), (c, "scale-run")
    }  # fmt: skip

    sim.actors[a].pid += 1  # a's logger process restarted: it watches nothing until asked again
    clock.now += 3.0
    for _ in range(3):
        fleet.step(Poll())
        clock.now += 3.0
    assert [(n, args) for n, _, args in sim.taken("watch", "unwatch")] == [(a, (ONE, ranks[a]))]

    fleet.step(SetNodes(target.run_id, set(ranks), ranks=ranks, attempt=TWO))  # a restart: a new attempt
    calls = sim.taken("watch", "unwatch")
    assert sorted((n, name, args[0]) for n, name, args in calls) == sorted(
        [(n, "watch", TWO) for n in (a, b, c)] + [(n, "unwatch", ONE) for n in (a, b, c)]
    )

    fleet.step(Retire(target.run_id, 5.0, None, 0, threading.Event()))  # the run ends
    assert sorted((n, name, args) for n, name, args in sim.taken("watch", "unwatch")) == [
        (n, "unwatch", (TWO,)) for n in sorted((a, b, c))
    ]
