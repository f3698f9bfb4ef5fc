"""Which rank the job waits for, and why: the attribution from the ranks' windows, each rank seen
on its own clock (``tests/support/step_sim.py`` runs synchronous steps through the rank side
itself: recorder, timed input, DDP's running means, the region), and from plain tables."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ray_wandb_nodes._steps import Attribution, Cause, RankWindow, StepMarks, attribute
from tests.support.step_sim import Profile, World

# Monotonic clocks start at each host's boot: hours to weeks apart, and never compared.
OFFSETS = [0, 3_600_000_000_000, 17 * 86_400_000_000_000 + 123_456_789, 5_000_000_007]
WARMUP, STEPS = 12, 120


def judged(profiles: list[Profile], offsets: list[int] | None = None, **kwargs: Any) -> Attribution:
    """The attribution of steps ``WARMUP`` to ``STEPS``, each rank's totals read from its region
    as the node reads them, made into windows as the driver side does."""
    world = World(profiles, offsets, **kwargs)
    marks, ranks = StepMarks(), range(len(profiles))
    world.run(WARMUP)
    for rank, totals in world.reads().items():
        marks.add(rank, totals)
    assert marks.advance(ranks) is None  # the first read of each rank: where its series starts
    world.run(STEPS - WARMUP)
    for rank, totals in world.reads().items():
        marks.add(rank, totals)
    got = marks.advance(ranks)
    assert got is not None and [w.rank for w in got] == list(range(len(profiles)))
    assert {(w.first_step, w.last_step) for w in got} == {(WARMUP, STEPS)}
    return attribute(got)


def test_a_rank_slow_on_its_input_is_named_with_its_input_and_what_it_costs() -> None:
    profiles = [Profile(), Profile(), Profile(input=245.0), Profile()]
    a = judged(profiles)
    assert a.basis == "wait"
    assert [f.rank for f in a.slow] == [2]
    f = a.slow[0]
    assert f.cause is Cause.INPUT
    assert f.part_s == pytest.approx(0.245, abs=1e-3)
    assert f.others_part_s == pytest.approx(0.005, abs=1e-3)
    assert f.lateness_s == pytest.approx(0.240, abs=2e-3)  # the others wait 240 ms more than it does
    assert f.impact == pytest.approx(f.lateness_s / a.step_s)
    assert a.communication is None


@pytest.mark.parametrize(
    ("profile", "cause"),
    [
        (Profile(forward=150.0), Cause.COMPUTE),
        (Profile(backward=150.0), Cause.COMPUTE),
        (Profile(optimizer=150.0), Cause.OPTIMIZER),
        (Profile(other=150.0), Cause.OTHER),
    ],
)
def test_the_cause_is_the_part_furthest_above_the_other_ranks_median(profile: Profile, cause: Cause) -> None:
    a = judged([Profile(), profile, Profile(), Profile()])
    assert [(f.rank, f.cause) for f in a.slow] == [(1, cause)]


def test_the_verdict_and_every_figure_are_the_same_whatever_each_rank_s_clock_reads() -> None:
    profiles = [Profile(), Profile(input=200.0), Profile(), Profile(forward=60.0)]
    at_zero = judged(profiles, [0, 0, 0, 0])
    offset = judged(profiles, OFFSETS)
    assert offset == at_zero
    assert [f.rank for f in offset.slow] == [1]


def test_a_balanced_job_names_no_rank_even_with_noise_on_every_step() -> None:
    rng = random.Random(7)
    jitter = [[rng.uniform(0.0, 8.0) for _ in range(8)] for _ in range(STEPS)]
    a = judged([Profile()] * 8, OFFSETS * 2, jitter=jitter)
    assert a.basis == "wait"
    assert a.slow == () and a.communication is None
    assert max(abs(v or 0.0) for v in a.lateness_s.values()) < 0.3 * a.step_s


def test_a_rank_just_under_the_threshold_is_not_named_and_just_over_it_is() -> None:
    # Impact = lateness / step; the step is the slow rank's busy time plus the all-reduce (3 ms).
    base = Profile()  # 38 ms busy
    under = judged([base, base, Profile(input=5.0 + 15.0)])  # 15 ms late of a 56 ms step: 27 %
    over = judged([base, base, Profile(input=5.0 + 20.0)])  # 20 ms late of a 61 ms step: 33 %
    assert under.slow == ()
    assert [f.rank for f in over.slow] == [2]


def test_several_ranks_slow_on_one_cause_are_each_named_the_latest_first() -> None:
    profiles = [Profile()] * 4 + [Profile(input=200.0), Profile(input=300.0)] + [Profile()] * 2
    a = judged(profiles)
    assert [(f.rank, f.cause) for f in a.slow] == [(5, Cause.INPUT), (4, Cause.INPUT)]


def test_when_every_rank_waits_long_and_none_is_late_communication_itself_is_slow() -> None:
    a = judged([Profile()] * 4, comm_ms=60.0)
    assert a.slow == ()
    assert a.communication is not None
    assert a.communication.least_wait_s == pytest.approx(0.060, abs=1e-3)
    assert a.communication.share == pytest.approx(0.060 / a.step_s)


def test_without_ddp_a_rank_is_named_by_its_input_alone_and_compute_is_not_claimed() -> None:
    slow_input = judged([Profile(), Profile(), Profile(input=200.0)], ddp=False)
    assert slow_input.basis == "parts"
    assert [(f.rank, f.cause) for f in slow_input.slow] == [(2, Cause.INPUT)]
    slow_compute = judged([Profile(), Profile(), Profile(forward=200.0)], ddp=False)
    assert slow_compute.basis == "parts" and slow_compute.slow == ()  # compute unmeasured: not named


def window(rank: int, step: float, wait: float | None, inp: float | None = 5.0, **parts: float) -> RankWindow:
    fwd, bwd = (parts.get("forward", 10.0), parts.get("backward", 20.0)) if wait is not None else (None, None)
    return RankWindow(
        rank, 100, 200, 100, step / 1e3, None if inp is None else inp / 1e3, parts.get("optimizer", 2.0) / 1e3,
        10 if wait is not None else 0, None if fwd is None else fwd / 1e3, None if bwd is None else bwd / 1e3,
        None if wait is None else wait / 1e3,
    )  # fmt: skip


def test_ranks_that_do_not_step_together_are_not_compared_without_a_wait() -> None:
    a = attribute([window(0, 100, None), window(1, 100, None), window(2, 300, None, inp=250.0)])
    assert a.basis is None and a.slow == ()


def test_one_rank_alone_cannot_be_compared() -> None:
    a = attribute([window(0, 100, 50)])
    assert a.basis is None and a.slow == ()


def test_a_lateness_under_the_floor_never_counts_however_short_the_step() -> None:
    a = attribute([window(0, 3.0, 1.5, inp=0.1), window(1, 3.0, 1.5, inp=0.1), window(2, 3.0, 0.0, inp=1.6)])
    assert a.slow == ()  # 1.5 ms late of a 3 ms step: half the step, under the 2 ms floor
