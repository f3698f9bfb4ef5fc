"""Windows by step, not by read (``_steps.marks``): each rank's reads kept as points by step
count, on its node between pings and on the driver side, and every rank compared over the same
steps however old the read that brought its points (a simulated synchronous job:
``tests/support/step_sim``)."""

from __future__ import annotations

import dataclasses

import pytest

from ray_wandb_nodes._steps import NodePoints, StepMarks, StepTotals, at_step
from ray_wandb_nodes._steps.attribution import Cause, attribute
from tests.support.step_sim import Profile, World

WORLD = 4


def series(world: World, every: dict[int, int], steps: int) -> dict[int, list[StepTotals]]:
    """Each rank read every ``every[rank]`` steps while the job runs ``steps`` steps."""
    out: dict[int, list[StepTotals]] = {r: [] for r in range(WORLD)}
    for step in range(1, steps + 1):
        world.run(1)
        reads = world.reads()
        for rank, n in every.items():
            if step % n == 0:
                out[rank].append(reads[rank])
    return out


def test_between_two_points_the_steps_parts_are_linear_and_ddps_are_the_earlier_points() -> None:
    world = World([Profile()] * 2)
    world.run(10)
    lo = world.reads()[0]
    world.run(10)
    hi = world.reads()[0]
    mid, gap = at_step([lo, hi], 15)  # type: ignore[misc]
    assert gap == 10 and mid.steps == 15
    assert mid.step_ns == round((lo.step_ns + hi.step_ns) / 2) and mid.intervals == (lo.intervals + hi.intervals) // 2
    assert (mid.forward_ns, mid.ddp_samples, mid.wait_ns) == (lo.forward_ns, lo.ddp_samples, lo.wait_ns)
    assert at_step([lo, hi], 10) == (lo, 0) and at_step([lo, hi], 20) == (hi, 0)
    assert at_step([lo, hi], 9) is None and at_step([lo, hi], 21) is None


def test_ranks_read_at_different_steps_are_compared_over_the_same_steps_and_the_slow_one_named() -> None:
    # Rank 2 waits 100 ms more for its input; its node is read every 3 steps, rank 3's every 40
    # (a node whose turn comes late): no two ranks' reads are at the same step but every 120th.
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()])
    points = series(world, {0: 1, 1: 7, 2: 3, 3: 40}, 240)
    marks = StepMarks()
    for rank, reads in points.items():
        for totals in reads:
            marks.add(rank, totals, pid=100 + rank)
    windows = marks.advance(range(WORLD))
    assert windows is not None
    # One stretch for all: from rank 3's first read to rank 1's last (238: the latest all reached)
    assert {(w.first_step, w.last_step) for w in windows} == {(40, 238)}
    found = attribute(windows)
    assert [(f.rank, f.cause) for f in found.slow] == [(2, Cause.INPUT)]
    assert found.slow[0].lateness_s == pytest.approx(0.1, rel=0.05)
    assert marks.advance(range(WORLD)) is None  # no rank moved past the window's end


def test_a_balanced_job_read_at_staggered_steps_names_no_rank() -> None:
    world = World([Profile()] * WORLD, jitter=[[(s * 7 + r * 3) % 5 for r in range(WORLD)] for s in range(400)])
    points = series(world, {0: 1, 1: 13, 2: 32, 3: 50}, 400)
    marks = StepMarks()
    for rank, reads in points.items():
        for totals in reads:
            marks.add(rank, totals)
    windows = marks.advance(range(WORLD))
    assert windows is not None and len({(w.first_step, w.last_step) for w in windows}) == 1
    assert attribute(windows).slow == ()


def test_a_rank_not_read_makes_no_window_and_its_first_read_does() -> None:
    world = World([Profile()] * WORLD)
    points = series(world, {0: 5, 1: 5, 2: 5, 3: 5}, 100)
    marks = StepMarks()
    for rank in (0, 1, 2):
        for totals in points[rank]:
            marks.add(rank, totals)
    assert marks.advance(range(WORLD)) is None
    for totals in points[3][-3:]:  # its node's ping brings the last three reads only
        marks.add(3, totals)
    windows = marks.advance(range(WORLD))
    assert windows is not None and {(w.first_step, w.last_step) for w in windows} == {(90, 100)}


def test_ends_known_too_loosely_wait_for_a_longer_window() -> None:
    world = World([Profile()] * WORLD)
    points = series(world, {0: 1, 1: 1, 2: 1, 3: 200}, 400)  # rank 3: a point every 200 steps
    marks = StepMarks(keep=10_000)
    for rank in range(WORLD):
        for totals in points[rank]:
            marks.add(rank, totals)
    marks.start = 250  # a window from step 250: rank 3's points there are 200 steps apart
    assert marks.advance(range(WORLD)) is None  # 150 steps known to within 200: not judged
    world_more = series(world, {0: 1, 1: 1, 2: 1, 3: 200}, 800)  # steps 401-1200
    for rank in range(WORLD):
        for totals in world_more[rank]:
            marks.add(rank, totals)
    windows = marks.advance(range(WORLD))
    assert windows is not None and {(w.first_step, w.last_step) for w in windows} == {(250, 1200)}


def test_a_new_process_of_a_rank_starts_its_series_again() -> None:
    world = World([Profile()] * 2)
    world.run(50)
    before = world.reads()
    marks = StepMarks()
    for rank, totals in before.items():
        marks.add(rank, totals, pid=10 + rank)
    again = World([Profile()] * 2)  # a new process of rank 1: its counts start at 0
    again.run(5)
    marks.add(1, again.reads()[1], pid=99)
    assert marks.latest(1) == again.reads()[1] and marks.start is None
    marks.add(1, before[1], pid=11)  # an old ping's point of the old process: another process again
    assert marks.latest(1) == before[1]


def test_the_same_points_fed_again_change_nothing() -> None:
    world = World([Profile()] * WORLD)
    points = series(world, {r: 4 for r in range(WORLD)}, 80)
    marks = StepMarks()
    for _ in range(3):  # the fleet feeds a ping's points on each check until the next ping
        for rank, reads in points.items():
            for totals in reads:
                marks.add(rank, totals, pid=1)
    windows = marks.advance(range(WORLD))
    assert windows is not None and windows[0].intervals == 76  # steps 4 to 80, once


def test_a_node_hands_each_ping_its_points_spread_with_the_first_and_the_latest() -> None:
    world = World([Profile()] * 2)
    node = NodePoints(per_take=4)
    reads = []
    for _ in range(20):
        world.run(3)
        reads.append(world.reads()[0])
        node.add("key", 0, 7, reads[-1])
        node.add("key", 0, 7, reads[-1])  # read again before the rank published: kept once
    taken = node.take()["key"]
    steps = [s.totals.steps for s in taken]  # the reads were 3 steps apart, 16 kept of 20 (thinned)
    assert steps[0] == 3 and steps[-1] == 60 and len(steps) == 4 and {(s.rank, s.pid) for s in taken} == {(0, 7)}
    assert all(abs(got - want) <= 3 for got, want in zip(steps, (3, 22, 41, 60), strict=True))  # evenly spread
    world.run(3)
    node.add("key", 0, 7, world.reads()[0])
    assert [s.totals.steps for s in node.take()["key"]] == [60, 63]  # the last ping's latest, then the new
    node.add("gone", 1, 8, reads[0])
    assert "gone" not in node.take(keys={"key"}) and node.take() == {"key": node.take()["key"]}


def test_a_node_keeps_a_bounded_number_of_points_between_two_pings() -> None:
    node = NodePoints(per_take=4)
    world = World([Profile()])
    for _ in range(500):
        world.run(1)
        node.add("key", 0, 1, world.reads()[0])
    held = node._points[("key", 0)][1]
    assert len(held) <= 4 * 4 and held[0].steps == 1 and held[-1].steps == 500
    assert dataclasses.asdict(held[-1]) == dataclasses.asdict(world.reads()[0])


def test_a_rank_not_read_for_long_leaves_the_others_series_bounded_and_a_window_once_it_is() -> None:
    world = World([Profile()] * WORLD)
    points = series(world, {0: 1, 1: 1, 2: 1, 3: 10}, 3000)
    marks = StepMarks(keep=64)
    for rank in (0, 1, 2):
        for totals in points[rank]:
            marks.add(rank, totals)
    assert all(len(marks._ranks[r].points) <= 64 for r in (0, 1, 2))
    for totals in points[3]:
        marks.add(3, totals)
    windows = marks.advance(range(WORLD))
    assert windows is not None and {(w.first_step, w.last_step) for w in windows} == {(10, 3000)}
