"""Which rank the job waits for, and why (pure): a function of the ranks' windows over the same
steps (``windows``), each a set of durations on that rank's own clock.

In synchronous data-parallel training every rank's step lasts as long as the slowest rank's, so
step times cannot name it; what differs is how long each rank waits in its collectives. The rank
that arrives last waits least:

- its **lateness** is the other ranks' median wait less its own (how much later than the median
  rank it arrives, each step);
- its **cause** is the part of its busy time (input, compute, optimizer, or the rest) furthest
  above the other ranks' median of that part;
- its **impact** is the share of every step the job loses to it: lateness / the median step (the
  step the job would take, less that lateness, if the rank kept pace).

A rank is slow once its impact is at least ``1 - threshold``: with the ``straggler_threshold``
of the node rule (0.7), once the job keeps less than 0.7 of the pace it would keep without it.
Where no rank is late but every rank waits at least that share of its step, communication itself
is slow (a link, a switch, a collective too large for the network).

Without DDP's timers no wait is measured: then a rank is named only by a part it measures (its
input, its optimizer) exceeding the other ranks' median by the same share of a step, and only
while the ranks step together (their steps within :data:`LOCKSTEP` of each other's median).
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .._stats import median_without
from .windows import RankWindow

FLOOR_S = 0.002  # a lateness or excess under 2 ms a step never counts (scheduling noise)
LOCKSTEP = 0.1  # without a wait: steps within 10 % of the median rank's are one synchronous job

Basis = Literal["wait", "parts"]


class Cause(str, enum.Enum):
    """What a slow rank spends its extra time on."""

    INPUT = "input"
    COMPUTE = "compute"  # forward and backward (DDP's timers)
    OPTIMIZER = "optimizer"
    OTHER = "other"  # the step less every part measured
    COMMUNICATION = "communication"  # every rank waits, none is late

    def __str__(self) -> str:
        return self.value


_PARTS: tuple[tuple[Cause, Callable[[RankWindow], float | None]], ...] = (
    (Cause.INPUT, lambda w: w.input_s),
    (Cause.COMPUTE, lambda w: w.compute_s),
    (Cause.OPTIMIZER, lambda w: w.optimizer_s),
    (Cause.OTHER, lambda w: w.other_s),
)


@dataclass(frozen=True)
class RankFinding:
    """One slow rank in one window."""

    rank: int
    lateness_s: float  # each step, how much later than the median rank it arrives
    impact: float  # the share of each step the job loses to it
    cause: Cause
    part_s: float  # its time a step in ``cause``
    others_part_s: float  # the other ranks' median of that part


@dataclass(frozen=True)
class CommFinding:
    """Every rank waits in its collectives and none arrives late."""

    wait_s: float  # the ranks' median wait a step
    least_wait_s: float
    share: float  # the least wait as a share of the step


@dataclass(frozen=True)
class Attribution:
    """The verdict on one set of windows over the same steps."""

    step_s: float  # the median rank's step
    basis: Basis | None  # how ranks were compared; None: they could not be (too few, not in step)
    lateness_s: Mapping[int, float | None]  # every rank's lateness against the median (None: unknown)
    slow: tuple[RankFinding, ...]  # the slow ranks, the latest first
    communication: CommFinding | None
    windows: tuple[RankWindow, ...]

    def finding(self, rank: int) -> RankFinding | None:
        return next((f for f in self.slow if f.rank == rank), None)


def attribute(windows: Sequence[RankWindow], threshold: float = 0.7, floor_s: float = FLOOR_S) -> Attribution:
    """The slow ranks among ``windows`` (one a rank, over the same steps) and their causes; a rank
    is slow once it costs the job at least ``1 - threshold`` of every step."""
    windows = tuple(sorted(windows, key=lambda w: w.rank))
    if len(windows) < 2:
        return Attribution(windows[0].step_s if windows else 0.0, None, {}, (), None, windows)
    step = statistics.median(w.step_s for w in windows)
    share = 1.0 - threshold
    if all(w.wait_s is not None for w in windows):
        return _by_wait(windows, step, share, floor_s)
    return _by_parts(windows, step, share, floor_s)


def _by_wait(windows: tuple[RankWindow, ...], step: float, share: float, floor_s: float) -> Attribution:
    waits = [w.wait_s or 0.0 for w in windows]
    ordered = sorted(waits)  # once: each rank's "others" is this less its own wait
    parts = _Parts(windows)
    lateness: dict[int, float | None] = {}
    slow = []
    for i, w in enumerate(windows):
        late = median_without(ordered, waits[i]) - waits[i]
        lateness[w.rank] = late
        if late >= floor_s and step > 0 and late / step >= share:
            cause, part, others = _cause(windows, i, parts)
            slow.append(RankFinding(w.rank, late, late / step, cause, part, others))
    comm = None
    least = min(waits)
    if not slow and step > 0 and least >= floor_s and least / step >= share:
        comm = CommFinding(statistics.median(waits), least, least / step)
    slow.sort(key=lambda f: (-f.lateness_s, f.rank))
    return Attribution(step, "wait", lateness, tuple(slow), comm, windows)


def _by_parts(windows: tuple[RankWindow, ...], step: float, share: float, floor_s: float) -> Attribution:
    if step <= 0 or any(abs(w.step_s - step) > LOCKSTEP * step for w in windows):
        return Attribution(step, None, {}, (), None, windows)  # not one synchronous job: not compared
    parts = _Parts(windows)
    lateness: dict[int, float | None] = {}
    slow = []
    for i, w in enumerate(windows):
        best: tuple[float, Cause, float, float] | None = None
        for cause, _ in _PARTS:
            if cause in (Cause.COMPUTE, Cause.OTHER):
                continue  # without a wait, the rest holds compute and waiting alike: not a cause
            excess = parts.excess(cause, i)
            if excess is not None and (best is None or excess[0] > best[0]):
                best = (excess[0], cause, excess[1], excess[2])
        lateness[w.rank] = best[0] if best is not None else None
        if best is not None and best[0] >= floor_s and best[0] / step >= share:
            slow.append(RankFinding(w.rank, best[0], best[0] / step, best[1], best[2], best[3]))
    slow.sort(key=lambda f: (-f.lateness_s, f.rank))
    return Attribution(step, "parts", lateness, tuple(slow), None, windows)


def _cause(windows: tuple[RankWindow, ...], i: int, parts: _Parts) -> tuple[Cause, float, float]:
    """The part of rank ``i``'s step furthest above the other ranks' median of it: (the part,
    its time, the others' median). Parts tie in the order input, compute, optimizer, other."""
    best: tuple[float, Cause, float, float] | None = None
    for cause, _ in _PARTS:
        excess = parts.excess(cause, i)
        if excess is not None and (best is None or excess[0] > best[0]):
            best = (excess[0], cause, excess[1], excess[2])
    if best is None:  # nothing but the step measured: the rest is the cause
        return Cause.OTHER, windows[i].other_s, statistics.median(w.other_s for j, w in enumerate(windows) if j != i)
    return best[1], best[2], best[3]


class _Parts:
    """Each part of every rank's window, and the part's values sorted once, so that a rank's
    "other ranks' median" of a part costs O(log n), not a sort of the others (a job of 8,000
    ranks is judged every few seconds)."""

    def __init__(self, windows: tuple[RankWindow, ...]) -> None:
        self._own = {cause: [part_of(w) for w in windows] for cause, part_of in _PARTS}
        self._sorted = {cause: sorted(v for v in values if v is not None) for cause, values in self._own.items()}

    def excess(self, cause: Cause, i: int) -> tuple[float, float, float] | None:
        """(rank ``i``'s part less the others' median of it, its part, that median); None where the
        rank or every other rank leaves the part unmeasured."""
        own = self._own[cause][i]
        ordered = self._sorted[cause]
        if own is None or len(ordered) < 2:
            return None
        median = median_without(ordered, own)
        return own - median, own, median
