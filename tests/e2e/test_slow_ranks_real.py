"""The slow rank named from real processes, without Ray: four ranks of torch.distributed over gloo
on this machine, each armed as a Train worker is (``arm_steps`` on its slot's step region), a
small DDP model trained from a ``DataLoader`` with no code of the plugin's in the loop
(``tests/support/steps_rank.py``). One run in three phases: balanced; rank 2's input slowed (its
dataset's ``__getitem__`` sleeps); rank 1's forward slowed. From outside, the test reads every
rank's region as the node reads it while they run, makes windows over the same steps as the
driver side does, and attributes and judges them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_wandb_nodes._health.rank_rule import RankPlace, RankRule
from ray_wandb_nodes._steps import Attribution, Cause, Sources, StepTotals, StepWindows, attribute
from tests.support.steps_rank import BASE_S, SLOW_S
from tests.support.steps_world import follow, rank_processes

pytest.importorskip("torch")

WORLD, PHASE = 4, 16  # a phase holds one of DDP's timed iterations past its first ten (1 in 13)
PHASES = f"balanced:0:{PHASE},input:2:{PHASE},forward:1:{PHASE}"
MARGIN = 3  # steps left out after a phase starts: the step that changes, and DDP's first (synced) ones
Reads = dict[int, dict[int, StepTotals]]


@pytest.fixture(scope="module")
def reads() -> Iterator[Reads]:
    """Every rank's reads over the whole run, by step count (one run for the module's tests)."""
    directory = Path(tempfile.mkdtemp(prefix="rwn-steps-test-"))
    try:
        with rank_processes(directory, WORLD, PHASES) as procs:
            # Bounded by the run itself (3 x 16 steps of 100 to 300 ms) and the ranks' start on 2
            # loaded cores (importing torch: up to ~15 s each, four at once); never a pass margin.
            yield follow(directory, procs, timeout_s=240)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def common(reads: Reads, first: int, last: int) -> list[int]:
    """The step counts in ``first..last`` that every rank's reads hold."""
    shared = set.intersection(*(set(r) for r in reads.values()))
    return sorted(s for s in shared if first <= s <= last)


def phase(reads: Reads, index: int) -> Attribution:
    """The attribution over phase ``index`` (0, 1, 2), from the earliest to the latest step count
    inside it that every rank was read at."""
    steps = common(reads, index * PHASE + MARGIN, (index + 1) * PHASE)
    assert len(steps) >= 2, f"phase {index}: reads at {steps}"
    windows = StepWindows(world=WORLD)
    assert windows.advance({r: reads[r][steps[0]] for r in reads}) is None
    got = windows.advance({r: reads[r][steps[-1]] for r in reads})
    assert got is not None, f"phase {index}: no windows over steps {steps[0]} to {steps[-1]}"
    return attribute(got)


def test_every_rank_measured_its_input_its_optimizer_and_ddp(reads: Reads) -> None:
    last = {r: reads[r][max(reads[r])] for r in reads}
    for totals in last.values():
        assert totals.steps == 3 * PHASE
        assert totals.sources == Sources.INPUT | Sources.OPTIMIZER | Sources.DDP
        assert totals.ddp_samples > 0 and totals.batches == totals.intervals


def test_a_balanced_run_names_no_rank(reads: Reads) -> None:
    a = phase(reads, 0)
    assert a.basis == "wait"
    assert a.slow == () and a.communication is None, a


def test_a_rank_whose_input_is_slowed_is_named_with_its_input(reads: Reads) -> None:
    a = phase(reads, 1)
    assert [(f.rank, f.cause) for f in a.slow] == [(2, Cause.INPUT)], a
    f = a.slow[0]
    assert f.part_s >= BASE_S + SLOW_S  # its sleep is in its input
    assert f.others_part_s < f.part_s - SLOW_S * 0.8
    assert f.impact > 0.5  # ~200 ms of a ~270 ms step


def test_a_rank_whose_forward_is_slowed_is_named_with_its_compute(reads: Reads) -> None:
    a = phase(reads, 2)
    assert [(f.rank, f.cause) for f in a.slow] == [(1, Cause.COMPUTE)], a
    assert a.slow[0].part_s >= SLOW_S


def test_the_rule_over_the_run_says_each_slow_rank_once_with_its_node_and_cause(reads: Reads) -> None:
    """The run's reads judged in order, as the driver side judges successive reads (a window
    forms once every rank has three intervals and a DDP sample since the last: here every 13
    steps, DDP's CPU rate). The rule says at its first sample (its hysteresis is the unit tests'
    claim): each slow rank once, with its node and cause, its recovery once, and nothing else."""
    rule = RankRule(window_s=0.0, min_samples=1)
    places = {r: RankPlace(f"node-{r}", None) for r in range(WORLD)}
    windows = StepWindows(world=WORLD)
    said = []
    for step in common(reads, MARGIN, 3 * PHASE):
        got = windows.advance({r: reads[r][step] for r in reads})
        if got is not None:
            said += [(step, a.title, a.level) for a in rule.judge(got, float(step), places)]
    assert sorted((t, level) for _, t, level in said) == [
        ("Slow rank recovered: rank 2 on node-2", "INFO"),
        ("Slow rank: rank 1 on node-1", "WARN"),
        ("Slow rank: rank 2 on node-2", "WARN"),
    ], said
    at = {title: step for step, title, _ in said}
    assert PHASE < at["Slow rank: rank 2 on node-2"] <= 2 * PHASE + MARGIN  # in its phase, not before
    assert 2 * PHASE < at["Slow rank: rank 1 on node-1"]
    assert 2 * PHASE < at["Slow rank recovered: rank 2 on node-2"]
