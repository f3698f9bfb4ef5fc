"""The fleet's plan: what to start, finish, lose and add, from plain data (a table of cases)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._config.values import NodeSelection
from ray_wandb_nodes._fleet.plan import Plan, RunWants, plan, wanted_writers


def want(run_id: str, *nodes: str, selection: str = "workers", covered: str | None = None) -> RunWants:
    return RunWants(run_id, NodeSelection(selection), frozenset(nodes), covered)


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


# loggers started ahead of the workers' placement: only on the nodes the job can use -------------
GPU8 = {"CPU": 96.0, "GPU": 8.0}
PRESTART_CASES: list[tuple[str, dict[str, dict[str, float]], dict[str, Any], list[str]]] = [
    (
        "a 2-node job (16 x 1 GPU) on a big cluster: 2 nodes, not every node with GPUs",
        {f"n{i:03d}": dict(GPU8) for i in range(500)},
        dict(workers=16, per_worker={"CPU": 1.0, "GPU": 1.0}),
        ["n000", "n001"],
    ),
    (
        "nodes other jobs hold are skipped; the ones with the most room come first",
        {
            "a": {"CPU": 96.0, "GPU": 0.0},
            "b": {"CPU": 96.0, "GPU": 2.0},
            "c": dict(GPU8),
            "d": {"CPU": 2.0, "GPU": 8.0},
        },
        dict(workers=4, per_worker={"CPU": 1.0, "GPU": 1.0}),
        ["c"],
    ),
    (
        "a node's room is its fewest over what a worker asks (here CPUs); never more nodes than workers",
        {"a": {"CPU": 4.0, "GPU": 8.0}, "b": {"CPU": 4.0, "GPU": 8.0}, "c": {"CPU": 4.0, "GPU": 8.0}},
        dict(workers=6, per_worker={"CPU": 4.0, "GPU": 1.0}),
        ["a", "b", "c"],
    ),
    (
        "fractional asks fit as Ray fits them",
        {"a": {"CPU": 1.0}, "b": {"CPU": 1.0}},
        dict(workers=2, per_worker={"CPU": 0.5}),
        ["a"],
    ),
    (
        "the controller's node counts for its room and gets no logger",
        {"head": {"CPU": 8.0}, "a": {"CPU": 8.0}, "b": {"CPU": 8.0}},
        dict(workers=12, per_worker={"CPU": 1.0}, exclude="head"),
        ["a"],
    ),
    (
        "no room anywhere (the autoscaler will add nodes): none",
        {"a": {"CPU": 0.0, "GPU": 0.0}},
        dict(workers=2, per_worker={"GPU": 1.0}),
        [],
    ),
]


@pytest.mark.parametrize(
    ("free", "job", "expected"), [c[1:] for c in PRESTART_CASES], ids=[c[0] for c in PRESTART_CASES]
)
def test_loggers_start_ahead_only_on_the_nodes_the_job_can_use(
    free: dict[str, dict[str, float]], job: dict[str, Any], expected: list[str]
) -> None:
    from ray_wandb_nodes._fleet.nodes import NodeInfo, prestart_nodes

    alive = {n: NodeInfo(n, f"host-{n}", "") for n in free}
    chosen = prestart_nodes(alive, free, exclude=job.pop("exclude", None), **job)
    assert sorted(n.node_id for n in chosen) == expected
