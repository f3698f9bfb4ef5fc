"""Whose console each node logger follows into each run (``_fleet/consoles.py``): a table of what
the runs want, then the real fleet over ``bench/fleet_scale.py``'s simulated nodes and loggers:
each member's logger is told its ranks after its writer's join and only when they change, an
observer past the writer cap is told nothing, an attempt's end reaches the loggers that follow
it, a restarted logger is told again, and a run's end tells none of them anything more (their
writers' finish, with the run's exit code, ends the console). The fleet's own node: its ranks'
lines go on the primary's queue, ended before the primary's finish."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from bench.fleet_scale import Quiet, make_target
from ray_wandb_nodes import _ray
from ray_wandb_nodes._config.values import ConsoleMode, NodeSelection
from ray_wandb_nodes._console import ConsoleLine, RankProcess, plan_console
from ray_wandb_nodes._failure import FailedAttempt, RayPoll, RayRankError
from ray_wandb_nodes._fleet.commands import AddRun, AttemptEnded, AttemptFailed, Poll, Retire, SetNodes
from ray_wandb_nodes._fleet.consoles import dead_ranks, wanted_consoles
from ray_wandb_nodes._fleet.fleet import NodeFleet
from ray_wandb_nodes._fleet.plan import observer_key
from ray_wandb_nodes._fleet.targets import SharedTarget, StandaloneTarget
from ray_wandb_nodes._fleet.wire import ConsoleEnd, ConsoleRanks
from tests.support.console_rank import worker_file
from tests.support.fakes import Clock
from tests.support.recording import RecordingCluster
from tests.support.wait import wait_until


def shared(ranks: dict[str, tuple[int, ...]], pids: dict[int, int], **kw: Any) -> Any:
    target = SharedTarget.__new__(SharedTarget)  # the fields wanted_consoles reads, no primary
    target.ranks, target.pids, target.covered_node = ranks, pids, kw.get("covered")
    target.console, target.ready = ConsoleMode(kw.get("console", "rank0")), kw.get("ready", True)
    target.primary = type("P", (), {"spec": type("S", (), {"run_id": kw.get("run_id", "r")})()})()
    return target


def told(run_id: str, plan: Any, *ranks: tuple[int, int]) -> ConsoleRanks:
    return ConsoleRanks(run_id, tuple(RankProcess(r, p) for r, p in ranks), plan)


PIDS = {0: 100, 1: 101, 2: 102}
THREE_ON_TWO = plan_console("rank0", 3, 2)
CASES = [
    ("each node its ranks and their processes, one plan for the run (3 ranks, 2 nodes)",
     [shared({"a": (1, 0), "b": (2,)}, PIDS)],
     ({"a": {"r": told("r", THREE_ON_TWO, (0, 100), (1, 101))}, "b": {"r": told("r", THREE_ON_TWO, (2, 102))}}, {})),
    ("the fleet's own node is followed by the fleet", [shared({"a": (1,), "head": (0,)}, PIDS, covered="head")],
     ({"a": {"r": told("r", plan_console("rank0", 2, 2), (1, 101))}}, {"r": told("r", plan_console("rank0", 2, 2),
                                                                                    (0, 100))})),
    ("the run's mode makes its plan", [shared({"a": (0,)}, PIDS, console="all")],
     ({"a": {"r": told("r", plan_console("all", 1, 1), (0, 100))}}, {})),
    ("rank_console off: nothing followed", [shared({"a": (0,)}, PIDS, console="off")], ({}, {})),
    ("a run not created yet: nothing followed (its lines would have no run)", [shared({"a": (0,)}, PIDS, ready=False)],
     ({}, {})),
    ("no process ids (not placed yet): nothing followed", [shared({"a": (0,)}, {})], ({}, {})),
    ("a rank without a process id is left out", [shared({"a": (0, 1)}, {1: 101})],
     ({"a": {"r": told("r", plan_console("rank0", 1, 1), (1, 101))}}, {})),
]  # fmt: skip


@pytest.mark.parametrize(("targets", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_what_the_runs_want_followed(targets: list[Any], expected: Any) -> None:
    assert wanted_consoles(targets) == expected


def test_a_standalone_run_follows_nothing() -> None:
    target = StandaloneTarget.__new__(StandaloneTarget)
    target.ranks, target.pids, target.covered_node, target.ready = {"a": (0,)}, {0: 100}, None, True
    assert wanted_consoles([target]) == ({}, {})


def test_each_member_is_told_its_ranks_after_its_join_and_ended_with_the_attempt() -> None:
    clock = Clock()
    sim = RecordingCluster(3, clock)
    a, b, c = sorted(sim.alive)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.health, target.max_writers, target.selection = None, 2, NodeSelection.WORKERS
    target.console = ConsoleMode.RANK0
    run = target.run_id
    fleet.step(AddRun(target))
    ranks = {a: (0, 1), b: (2, 3), c: (4, 5)}
    pids = {r: 1000 + r for r in range(6)}
    plan = plan_console("rank0", 6, 3)
    fleet.step(SetNodes(run, set(ranks), ranks=ranks, pids=pids))
    calls = sim.taken("add_writer", "console", "console_end")
    # Members (a, b) are told their ranks after their writer's join; c, an observer past the cap, is not.
    assert {(n, args[0].run_id) for n, name, args in calls[:3] if name == "add_writer"} == {
        (a, run), (b, run), (c, observer_key(run))
    }  # fmt: skip
    assert calls[3:] == [
        (a, "console", (told(run, plan, (0, 1000), (1, 1001)),)),
        (b, "console", (told(run, plan, (2, 1002), (3, 1003)),)),
    ]

    fleet.step(SetNodes(run, set(ranks), ranks=ranks, pids=pids))  # the same placement again: nothing sent
    assert sim.taken("console", "console_end") == []

    fleet.step(AttemptEnded(run, failed=True))  # the attempt failed: its followers end it, at once
    assert sorted((n, args) for n, _, args in sim.taken("console", "console_end")) == [
        (a, (ConsoleEnd(run, True),)),
        (b, (ConsoleEnd(run, True),)),
    ]

    new = {r: 2000 + r for r in range(6)}  # the restart's processes; rank 3 moves to a
    moved = {a: (0, 1, 3), b: (2,), c: (4, 5)}
    fleet.step(SetNodes(run, set(moved), ranks=moved, pids=new))
    assert sorted((n, args) for n, _, args in sim.taken("console", "console_end")) == [
        (a, (told(run, plan, (0, 2000), (1, 2001), (3, 2003)),)),
        (b, (told(run, plan, (2, 2002)),)),
    ]

    sim.actors[a].pid += 1  # a's logger process restarted: it follows nothing until told again
    for _ in range(3):
        clock.now += 3.0
        fleet.step(Poll())
    assert [(n, name) for n, name, _ in sim.taken("add_writer", "console")] == [(a, "console")]

    gone = {a: (0, 1, 3), c: (2, 4, 5)}  # b's ranks left the run (its writer stays, as the plan says)
    fleet.step(SetNodes(run, {a, b, c}, ranks=gone, pids=new))
    assert (b, "console", (told(run, plan),)) in sim.taken("console")  # b's ranks end there (the old plan's)

    fleet.step(Retire(run, 5.0, None, 1, threading.Event()))  # the run ends: its writers' finish ends it
    calls = sim.taken("console", "console_end", "finish")
    assert {name for _, name, _ in calls} == {"finish"}
    assert {args for _, _, args in calls} == {(run, 1), (observer_key(run), 1)}


def failed_attempt(
    attempt: int, *errors: RayRankError, unanswered: tuple[int, ...] = (), running: tuple[int, ...] = ()
) -> FailedAttempt:
    return FailedAttempt(attempt, True, -1, RayPoll(errors, running, unanswered), ())


DIED = RayRankError(3, "ActorDiedError", "the actor died", died=True)
RAISED = RayRankError(0, "ValueError", "bad shard 17")
GLOO_TIMEOUT = "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv operation to complete"
TIMED_OUT = RayRankError(2, "RuntimeError", GLOO_TIMEOUT)
DEAD: list[tuple[str, FailedAttempt | None, tuple[int, ...], tuple[int, ...]]] = [
    ("no failed attempt known, no hang: none", None, (), ()),
    ("a death before a raise, whatever their ranks", failed_attempt(1, RAISED, DIED), (), (3, 0)),
    ("the poll's silent ranks last", failed_attempt(1, RAISED, unanswered=(5, 0)), (), (0, 5)),
    ("a hang's stopped rank first, alive or not", failed_attempt(1, RAISED, DIED), (4,), (4, 3, 0)),
    ("a hang alone", None, (1, 2), (1, 2)),
    (
        "behind a collective timeout, the ranks that did not time out first",
        failed_attempt(1, TIMED_OUT, running=(1,)),
        (),
        (1, 2),
    ),
    (
        "NCCL's watchdog aborted most ranks at once, none raised: the one still running first",
        failed_attempt(
            1, *(RayRankError(r, "ActorDiedError", "the actor died", died=True) for r in (0, 2, 3)), running=(1,)
        ),
        (),
        (1, 0, 2, 3),
    ),
    ("one rank killed, the others running: the dead one alone", failed_attempt(1, DIED, running=(0, 1, 2)), (), (3,)),
    (
        "a raise of its own beside the ranks still running: those are not waited for",
        failed_attempt(1, RAISED, running=(1,)),
        (),
        (0,),
    ),
]


@pytest.mark.parametrize(("failed", "stopped", "expected"), [d[1:] for d in DEAD], ids=[d[0] for d in DEAD])
def test_dead_ranks(failed: FailedAttempt | None, stopped: tuple[int, ...], expected: tuple[int, ...]) -> None:
    assert dead_ranks(failed, stopped) == expected


def test_each_failed_attempt_s_dead_ranks_are_named_to_their_nodes_with_lines_from_the_run_s_pool() -> None:
    clock = Clock()
    sim = RecordingCluster(2, clock)
    a, b = sorted(sim.alive)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    target.health, target.selection, target.console = None, NodeSelection.WORKERS, ConsoleMode.RANK0
    run = target.run_id
    fleet.step(AddRun(target))
    ranks = {a: (0, 1), b: (2, 3)}
    fleet.step(SetNodes(run, set(ranks), ranks=ranks, pids={r: 1000 + r for r in range(4)}))
    sim.taken("add_writer", "console")
    # Attempt 1: rank 3 died (on b), rank 0 raised (on a); each node is told its own, 200 lines each.
    fleet.step(AttemptFailed(run, failed_attempt(1, RAISED, DIED)))
    fleet.step(AttemptEnded(run, failed=True))
    assert sorted((n, args) for n, _, args in sim.taken("console_end")) == [
        (a, (ConsoleEnd(run, True, ((0, 200),)),)),
        (b, (ConsoleEnd(run, True, ((3, 200),)),)),
    ]
    # Attempt 2 fails too (rank 2 raised): its dead rank gets its lines as well, from what is left.
    fleet.step(SetNodes(run, set(ranks), ranks=ranks, pids={r: 2000 + r for r in range(4)}))
    fleet.step(AttemptFailed(run, failed_attempt(2, RayRankError(2, "ValueError", "again"))))
    fleet.step(AttemptEnded(run, failed=True))
    assert sorted((n, args) for n, _, args in sim.taken("console_end")) == [
        (a, (ConsoleEnd(run, True, ()),)),
        (b, (ConsoleEnd(run, True, ((2, 200),)),)),
    ]
    # An attempt that ends well names none, and a failure's record is used once.
    fleet.step(AttemptEnded(run, failed=False))
    assert {args for _, _, args in sim.taken("console_end")} == {(ConsoleEnd(run, False, ()),)}


class Primary:
    """What the fleet's own node's tailer writes to: the primary's queue."""

    def __init__(self) -> None:
        self.lines: list[ConsoleLine] = []
        self.finished_with: list[int] = []
        self._lock = threading.Lock()

    def console_lines(self, lines: list[ConsoleLine]) -> None:
        with self._lock:
            self.lines += lines

    def texts(self) -> list[str]:
        with self._lock:
            return [f"{x.rank}:{x.text}" for x in self.lines]


def test_the_fleets_own_node_writes_through_the_primary_and_ends_before_its_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    sim = RecordingCluster(1, clock)
    monkeypatch.setattr(_ray, "logs_dir", lambda: str(tmp_path))
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    primary = Primary()
    target.primary.console_lines = primary.console_lines  # type: ignore[method-assign]
    target.health, target.selection, target.console = None, NodeSelection.WORKERS, ConsoleMode.RANK0
    # Ranks 0 and 1 on the fleet's own node, one "process" each: rank 0 is this test's, rank 1 one
    # that ended already (its files stay, as Ray leaves a dead worker's).
    files = {0: os.getpid(), 1: 2**22 + 7}
    for rank, pid in files.items():
        worker_file(tmp_path, pid, "err").write_text(f"rank {rank} says hello\n")
        worker_file(tmp_path, pid, "out").write_text("")
    fleet.step(AddRun(target))
    fleet.step(SetNodes(target.run_id, {"head"}, "head", ranks={"head": (0, 1)}, pids=files))
    wait_until(lambda: "0:rank 0 says hello" in primary.texts(), 30, "rank 0's line on the primary's queue")
    assert sim.taken("console") == []  # no logger is told of the fleet's own node
    assert "1:rank 1 says hello" not in primary.texts()  # rank 0's live (the default); rank 1's kept back

    then: list[list[str]] = []
    done = threading.Event()
    fleet.step(Retire(target.run_id, 30.0, lambda: then.append(primary.texts()), 1, done))

    def turn() -> bool:  # one of the fleet thread's turns: none waits on the tailer, each asks it
        clock.now += 0.2
        fleet.step(Poll())
        return done.is_set()

    wait_until(turn, 30, "the run's end once the tailer's last lines are out")  # its thread, real time
    # The primary's finish (``then``) came after the failed run's last lines were on its queue.
    assert then and "1:rank 1 says hello" in then[0], then
