"""A run's ranks' step totals gathered for its monitor on the fleet thread (``_fleet/steps``):
from each node logger's read of the attempt, off the beacon slots of the primary's own node, each
rank placed at its node and labelled; the ranks a Train run inside a Tune trial publishes; nothing
before the run is ready."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ray_wandb_nodes._fleet.steps import feed_steps
from ray_wandb_nodes._hang import run_dir
from ray_wandb_nodes._hang.beacon import Beacon
from ray_wandb_nodes._health import RankAt
from ray_wandb_nodes._steps import RankSteps, RegionWriter, StepTotals
from tests.support.step_sim import Profile, World

KEY, OTHER_KEY = "run-1.attempt-2", "run-1.attempt-1"


class Health:
    """What ``feed_steps`` hands the run's monitor, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[int, StepTotals], dict[int, RankAt], bool]] = []

    def rank_steps(
        self, steps: Iterable[RankSteps], at: Mapping[int, RankAt], gpus: bool = True, attempt: str | None = None
    ) -> None:
        self.calls.append(({s.rank: s.totals for s in steps}, dict(at), gpus))


def totals(world: int = 6) -> dict[int, StepTotals]:
    w = World([Profile()] * world)
    w.run(15)
    return w.reads()


def handle(label: str, steps: dict[str, tuple[RankSteps, ...]]) -> Any:
    return SimpleNamespace(node=SimpleNamespace(label=label), steps=steps)


def target(ranks: dict[str, tuple[int, ...]], **fields: Any) -> Any:
    primary = SimpleNamespace(spec=SimpleNamespace(label="node-head-0"))
    base = dict(
        health=Health(),
        attempt=KEY,
        hangs=None,
        ranks=ranks,
        ready=True,
        covered_node="head",
        primary=primary,
        steps_fed={},
    )
    return SimpleNamespace(**{**base, **fields})


def pool(handles: dict[str, Any]) -> Any:
    return SimpleNamespace(get=handles.get)


@contextmanager
def slots_on_the_primary_node(root: Path, written: dict[int, StepTotals | None]) -> Iterator[None]:
    """Beacon slots of this process under ``root``, one a rank, their step region written with
    the given totals (None: not written yet)."""
    beacons = [Beacon(run_dir(KEY, root), rank) for rank in written]
    try:
        for beacon, t in zip(beacons, written.values(), strict=True):
            if t is not None:
                RegionWriter(beacon.extension).write_totals(t)
        yield
    finally:
        for beacon in beacons:
            beacon.close()


def test_every_placed_rank_is_fed_from_its_node_with_its_node_and_label(tmp_path: Path) -> None:
    t = totals()
    run = target({"head": (0, 1), "a": (2, 3), "b": (4, 5)})
    handles = {
        # node a: its logger read ranks 2 and 3 of this attempt, rank 9 (not placed here) and an
        # earlier attempt's rank 3, neither of which is fed
        "a": handle("node-a-1", {KEY: (RankSteps(2, t[2]), RankSteps(3, t[3]), RankSteps(9, t[0])), OTHER_KEY: ()}),
    }
    known = {"b": SimpleNamespace(label="node-b-2")}  # node b: no logger (yet): its label is known, no totals
    with slots_on_the_primary_node(tmp_path, {0: t[0], 1: None}):  # rank 1's region not written yet
        feed_steps(run, pool(handles), known, root=tmp_path)
    [(fed, at, gpus)] = run.health.calls
    assert fed == {0: t[0], 2: t[2], 3: t[3]}
    assert at == {
        0: RankAt("head", "node-head-0"),
        1: RankAt("head", "node-head-0"),
        2: RankAt("a", "node-a-1"),
        3: RankAt("a", "node-a-1"),
        4: RankAt("b", "node-b-2"),
        5: RankAt("b", "node-b-2"),
    }
    assert gpus  # the run's own ranks: their GPUs are the ones its nodes map


def test_an_earlier_attempts_totals_are_never_fed() -> None:
    t = totals()
    run = target({"a": (0, 1)})
    feed_steps(run, pool({"a": handle("node-a-1", {OTHER_KEY: (RankSteps(0, t[0]), RankSteps(1, t[1]))})}), {})
    [(fed, at, _)] = run.health.calls
    assert fed == {} and set(at) == {0, 1}


def test_a_train_run_inside_a_tune_trial_is_fed_the_ranks_it_published_without_gpus() -> None:
    t = totals()
    hangs = SimpleNamespace(ranks={"a": (0, 1)})  # the trial's Train run published its ranks
    run = target({}, hangs=hangs, covered_node=None)
    feed_steps(run, pool({"a": handle("node-a-1", {KEY: (RankSteps(0, t[0]), RankSteps(1, t[1]))})}), {})
    [(fed, at, gpus)] = run.health.calls
    assert fed == {0: t[0], 1: t[1]} and at == {0: RankAt("a", "node-a-1"), 1: RankAt("a", "node-a-1")}
    assert not gpus  # the trial's nodes' GPUs are not mapped to these ranks


def test_nothing_is_fed_before_the_run_is_ready_or_without_an_attempt_or_ranks() -> None:
    t = totals()
    handles = {"a": handle("node-a-1", {KEY: (RankSteps(0, t[0]),)})}
    for fields in ({"ready": False}, {"attempt": None}, {"ranks": {}}):
        run = target(**{"ranks": {"a": (0,)}, **fields})
        feed_steps(run, pool(handles), {})
        assert run.health.calls == [], fields
    feed_steps(target({"a": (0,)}, health=None), pool(handles), {})  # no health kept: nothing, no error


def test_a_pings_points_are_fed_once_and_the_next_pings_again() -> None:
    t = totals()
    handles = {"a": handle("node-a-1", {KEY: (RankSteps(0, t[0]), RankSteps(1, t[1]))})}
    run = target({"a": (0, 1)})
    feed_steps(run, pool(handles), {})
    feed_steps(run, pool(handles), {})  # the next check, before the next ping: nothing new
    handles["a"].steps = {KEY: (RankSteps(0, t[0]), RankSteps(1, t[1]))}  # the next ping (a new tuple)
    feed_steps(run, pool(handles), {})
    assert [sorted(fed) for fed, _, _ in run.health.calls] == [[0, 1], [], [0, 1]]
    assert all(sorted(at) == [0, 1] for _, at, _ in run.health.calls)  # where they run: every check


def test_a_node_reads_its_ranks_between_pings_and_a_ping_carries_the_points_with_their_process(tmp_path: Path) -> None:
    import os

    from ray_wandb_nodes._fleet.node_steps import NodeSteps
    from ray_wandb_nodes._hang import NodeWatch

    world = World([Profile()] * 2)
    watch = NodeWatch(tmp_path)
    watch.watch(KEY, (0, 1))
    node = NodeSteps(watch)
    beacons = [Beacon(run_dir(KEY, tmp_path), rank) for rank in (0, 1)]
    try:
        writers = [RegionWriter(b.extension) for b in beacons]
        for _ in range(5):  # five reads of the node's own second, the ranks 10 steps on each time
            world.run(10)
            for writer, t in zip(writers, world.reads().values(), strict=True):
                writer.write_totals(t)
            node.read()
        taken = node.take(watch.read())  # the ping's own read adds nothing new: the same steps
        steps = {rank: [s.totals.steps for s in taken[KEY] if s.rank == rank] for rank in (0, 1)}
        assert steps == {0: [10, 20, 30, 40, 50], 1: [10, 20, 30, 40, 50]}
        assert {s.pid for s in taken[KEY]} == {os.getpid()}
        world.run(10)
        for writer, t in zip(writers, world.reads().values(), strict=True):
            writer.write_totals(t)
        again = node.take(watch.read())  # the next ping: the last one's latest, then the ping's read
        assert [s.totals.steps for s in again[KEY] if s.rank == 0] == [50, 60]
    finally:
        for beacon in beacons:
            beacon.close()


def test_a_status_between_two_pings_keeps_the_last_ones_points_until_they_are_fed() -> None:
    from ray_wandb_nodes._fleet.wire import merged_steps

    t = totals()
    first = {KEY: (RankSteps(0, t[0]), RankSteps(1, t[1]))}
    refresh = {KEY: (RankSteps(0, t[2]),)}  # a hang's refresh asked the node's status: its points taken
    merged = merged_steps(first, refresh)
    assert merged[KEY][-1] == RankSteps(0, t[2]) and RankSteps(1, t[1]) in merged[KEY]
    assert merged_steps(merged, {KEY: ()}) == {KEY: ()} and merged_steps({}, refresh) == refresh
