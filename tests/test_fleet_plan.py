"""The fleet's plan: what to start, finish, lose and add, from plain data (a table of cases)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._fleet.plan import Plan, RunWants, plan, wanted_writers


def want(run_id: str, *nodes: str, selection: str = "workers", covered: str | None = None) -> RunWants:
    return RunWants(run_id, selection, frozenset(nodes), covered)


CASES: list[tuple[str, dict[str, Any], Plan]] = [
    (
        "nothing wanted, nothing held: nothing to do",
        dict(loggers={}, wants=[], alive=["a", "b"], collecting={}),
        Plan(),
    ),
    (
        "a run's nodes get a logger each and a writer in it",
        dict(loggers={}, wants=[want("r", "a", "b")], alive=["a", "b"], collecting={}),
        Plan(start=("a", "b"), add=(("a", "r"), ("b", "r"))),
    ),
    (
        "the primary's own node gets no writer",
        dict(loggers={}, wants=[want("r", "a", "b", covered="a")], alive=["a", "b"], collecting={}),
        Plan(start=("b",), add=(("b", "r"),)),
    ),
    (
        "a node that is not alive gets nothing",
        dict(loggers={}, wants=[want("r", "a", "gone")], alive=["a"], collecting={}),
        Plan(start=("a",), add=(("a", "r"),)),
    ),
    (
        "cluster selection: every alive node but the primary's",
        dict(loggers={}, wants=[want("r", selection="cluster", covered="h")], alive=["h", "a", "b"], collecting={}),
        Plan(start=("a", "b"), add=(("a", "r"), ("b", "r"))),
    ),
    (
        "what is in place stays: nothing to do",
        dict(loggers={"a": {"r"}}, wants=[want("r", "a")], alive=["a"], collecting={}),
        Plan(),
    ),
    (
        "a second run on a node with a logger: a writer only",
        dict(loggers={"a": {"r1"}}, wants=[want("r1", "a"), want("r2", "a")], alive=["a"], collecting={}),
        Plan(add=(("a", "r2"),)),
    ),
    (
        "a run that no longer uses a node: its writer finishes, the logger stays",
        dict(loggers={"a": {"r1", "r2"}}, wants=[want("r1", "a")], alive=["a"], collecting={}),
        Plan(finish=(("a", "r2"),)),
    ),
    (
        "a dead node's logger is lost, a replacement node gets one",
        dict(loggers={"a": {"r"}, "b": {"r"}}, wants=[want("r", "a", "c")], alive=["a", "c"], collecting={}),
        Plan(start=("c",), lost=("b",), add=(("c", "r"),)),
    ),
    (
        "a run whose offline data is being collected on a node gets no new writer there",
        dict(loggers={"a": set()}, wants=[want("r", "a", "b")], alive=["a", "b"], collecting={"r": {"a"}}),
        Plan(start=("b",), add=(("b", "r"),)),
    ),
    (
        "another run's collection does not hold this one",
        dict(loggers={"a": set()}, wants=[want("r", "a")], alive=["a"], collecting={"other": {"a"}}),
        Plan(add=(("a", "r"),)),
    ),
    (
        "a run that ended: every writer of it finishes",
        dict(loggers={"a": {"r"}, "b": {"r"}}, wants=[], alive=["a", "b"], collecting={}),
        Plan(finish=(("a", "r"), ("b", "r"))),
    ),
]


@pytest.mark.parametrize(("case", "given", "expected"), CASES, ids=[c[0] for c in CASES])
def test_plan(case: str, given: dict[str, Any], expected: Plan) -> None:
    assert plan(**given) == expected


def test_an_empty_plan_is_false_and_any_step_is_true() -> None:
    assert not Plan()
    assert Plan(lost=("a",))


def test_wanted_writers_groups_runs_by_node() -> None:
    wants = [want("r1", "a", "b"), want("r2", "b"), want("r3", selection="cluster", covered="a")]
    assert wanted_writers(wants, ["a", "b", "c"]) == {"a": {"r1"}, "b": {"r1", "r2", "r3"}, "c": {"r3"}}


def test_an_unknown_selection_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'nodes-please'"):
        plan({}, [want("r", "a", selection="nodes-please")], ["a"], {})
