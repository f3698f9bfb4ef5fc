"""The pool's joins (``_fleet/joins.py``) and the statuses it takes in (``_fleet/intake.py``),
each on its own, over fake calls and a clock the test moves: a join that answers is handed on and
counted joined; one that never answers is given up past wandb's init timeout and the grace, with
one warning, and counted joined too; a status's join error is said once per writer, a failed call
once per node, and a changed summary marks its node updated until taken."""

from __future__ import annotations

from typing import Any

from ray_wandb_nodes._fleet.handle import LoggerHandle
from ray_wandb_nodes._fleet.intake import StatusIntake
from ray_wandb_nodes._fleet.joins import JOIN_GRACE_S, Joins
from ray_wandb_nodes._fleet.nodes import NodeInfo
from tests.support.fakes import Clock, logger_status, summary


class Calls:
    """Ray's calls on the loggers: those in ``answers`` have answered (an exception: it failed)."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}

    def answered(self, refs: list[Any]) -> set[Any]:
        return {r for r in refs if r in self.answers}

    def result(self, ref: Any) -> Any:
        answer = self.answers[ref]
        if isinstance(answer, Exception):
            raise answer
        return answer


class Said:
    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def warn(self, key: str, message: str) -> None:
        self.said.append((key, message))


def handle(node_id: str) -> LoggerHandle:
    return LoggerHandle(node=NodeInfo(node_id, f"host-{node_id}", "10.0.0.1"), actor=None, pg=None)


def test_a_join_that_answers_is_handed_on_and_one_that_never_does_is_given_up_once() -> None:
    calls, said, clock = Calls(), Said(), Clock()
    joins = Joins(init_timeout_s=90.0, warner=said, actors=calls, clock=clock)  # type: ignore[arg-type]
    a, b = handle("a"), handle("b")
    joins.add(a, "run-1", "join-a")
    joins.add(b, "run-1", "join-b")
    assert joins.joining("run-1") and not joins.joining("run-2") and joins.of(a) == {"run-1"}
    answered: list[tuple[str, str]] = []
    calls.answers["join-a"] = object()
    joins.check(lambda h, ref, run_id: answered.append((h.node.node_id, ref)))
    assert answered == [("a", "join-a")] and joins.joined == {("a", "run-1")} and joins.of(a) == set()
    clock.now += 90.0 + JOIN_GRACE_S  # not past it yet
    joins.check(lambda *_: None)
    assert joins.joining("run-1") and not said.said
    clock.now += 1.0
    joins.check(lambda *_: None)
    assert not joins and joins.joined == {("a", "run-1"), ("b", "run-1")}
    [(key, text)] = said.said
    assert key == "join-timeout:b:run-1" and "has not joined the W&B run run-1" in text


def test_a_status_is_taken_in_and_each_problem_it_shows_said() -> None:
    calls, said, clock = Calls(), Said(), Clock()
    intake = StatusIntake(said, calls, clock)  # type: ignore[arg-type]
    a = handle("a")
    calls.answers["failed"] = RuntimeError("actor died")
    assert intake.check_status(a, "failed") is None
    assert said.said[-1][0] == "node-dead:a"
    calls.answers["status"] = logger_status(
        "a", 42, ("run-1",), errors={"run-2": "no network"}, summaries={"run-1": summary(100.0)}
    )
    status = intake.check_status(a, "status", "run-2")
    assert status is not None and a.pid == 42 and a.progress_at == clock.now and a.summary == summary(100.0)
    assert said.said[-1][0] == "node-init:a:run-2" and "no network" in said.said[-1][1]
    assert intake.updated_now() == {"a"} and intake.take_updated() == {"a"} and intake.take_updated() == set()
    intake.check_status(a, "status")  # the same summary again: no change
    assert intake.take_updated() == set() and intake.take_ways() == []
