"""Step marks (pure): each rank's totals kept by step count, so that the ranks are compared over
the same steps however old the reads that brought them.

At 1,000 nodes the fleet reaches each node about every 47 s (``_fleet.pool``: 64 pings a tick),
so the ranks' latest totals on the driver side are read up to a ping's turn apart: compared as
read, no two nodes' windows cover the same steps. Here a read is kept for the steps it covers,
not for when it came: every rank's totals form a series of points by step count (its node keeps
the points it read between two pings, :class:`NodePoints`; the driver side merges them,
:class:`StepMarks`), and a window runs from step ``S1`` to ``S2`` for every rank alike, ``S2`` the
latest step every rank has reached in what was read, ``S1`` where the last window ended.

Between two points a rank's totals are taken as linear in its step count (:func:`at_step`): the
step's own parts (its duration, input and optimizer, the intervals counted) are, for a rank that
steps at an even pace between the points, and where it does not the error is bounded by the gap
between the two points, which a window is judged only when it is at most a quarter of
(:data:`GAP_SHARE`). DDP's parts change only when the rank reads DDP's timers (one iteration in
its sample rate), so they are taken as of the point at or before the step, never blended: a
window's DDP parts are those of the iterations DDP timed between its two ends' reads.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, fields

from .region import RankSteps, Sources, StepTotals
from .windows import MAX_DDP_HOLD, MIN_INTERVALS, RankWindow, rank_window

# The totals that grow with every step, taken linearly between two points; every other field
# (DDP's, read on its sampled iterations) is taken from the point at or before.
LINEAR = frozenset(
    {"steps", "intervals", "step_ns", "input_ns", "batches", "optimizer_ns", "passes", "busy_ns", "collective_ns"}
)
GAP_SHARE = 4  # a window is judged once every rank's points at its ends are at most span / 4 apart
NODE_POINTS = 16  # points a rank a node's ping carries at most (spread over the steps since the last)
KEEP = 256  # points a rank the driver side keeps at most (thinned past it: see thin())
_FIELDS = tuple(f.name for f in fields(StepTotals))
_values = operator.attrgetter(*_FIELDS)  # a point's fields as a tuple, in order (a C call)
_LINEAR_AT = tuple(k for k, name in enumerate(_FIELDS) if name in LINEAR)
_STEPS_AT = _FIELDS.index("steps")


def at_step(points: Sequence[StepTotals], step: int) -> tuple[StepTotals, int] | None:
    """A rank's totals at ``step`` from its ``points`` (in step order), with the gap in steps
    between the two points it lies between (0 where a point is at ``step``); None outside them."""
    found = _bracket(points, step)
    if found is None:
        return None
    lo, hi = points[found[0]], points[found[1]]
    if lo is hi:
        return lo, 0
    share = (step - lo.steps) / (hi.steps - lo.steps)
    values, his = list(_values(lo)), _values(hi)
    for k in _LINEAR_AT:
        values[k] = round(values[k] + share * (his[k] - values[k]))
    values[_STEPS_AT] = step
    return StepTotals(*values), hi.steps - lo.steps


@dataclass
class _Rank:
    pid: int = 0
    points: list[StepTotals] = field(default_factory=list)


class StepMarks:
    """Every rank's points of one run's attempt, and the windows over the same steps they give.
    One owner: the thread that judges the ranks."""

    def __init__(self, min_intervals: int = MIN_INTERVALS, max_ddp_hold: int = MAX_DDP_HOLD, keep: int = KEEP) -> None:
        self.min_intervals, self.max_ddp_hold, self.keep = min_intervals, max_ddp_hold, keep
        self._ranks: dict[int, _Rank] = {}
        self.start: int | None = None  # the step where the next window starts (the last one's end)
        self._tried: tuple[int | None, int] | None = None  # (start, end) of the last window not ready

    def add(self, rank: int, totals: StepTotals, pid: int = 0) -> None:
        """One point of ``rank`` (``pid``: its process, 0 where not known). A point already kept,
        or older than the rank's latest, changes nothing (the same ping is fed on every check);
        another process of the rank starts its series again."""
        kept = self._ranks.get(rank)
        if kept is None or (pid and kept.pid and pid != kept.pid) or (not pid and _restarted(kept.points, totals)):
            self._ranks[rank] = _Rank(pid, [totals])
            self.start = None  # its steps count from its own start: the windows begin again
            return
        points = kept.points
        kept.pid = kept.pid or pid
        if totals.steps > points[-1].steps:
            points.append(totals)
            if len(points) > self.keep:
                thin(points)
        elif totals.steps == points[-1].steps and totals.ddp_samples > points[-1].ddp_samples:
            points[-1] = totals  # the same step published again with DDP's timers read (the last publish)

    def add_all(self, steps: Iterable[RankSteps]) -> None:
        for s in steps:
            self.add(s.rank, s.totals, s.pid)

    def forget(self, rank: int) -> None:
        self._ranks.pop(rank, None)

    def latest(self, rank: int) -> StepTotals | None:
        kept = self._ranks.get(rank)
        return kept.points[-1] if kept is not None else None

    def advance(self, ranks: Collection[int]) -> list[RankWindow] | None:
        """The windows of ``ranks`` from the last window's end to the latest step all of them
        reached, by rank; None while there is none to judge: a rank without points, too few steps
        since, points too far apart at the ends (see :data:`GAP_SHARE`), or a DDP job whose ranks
        have no timed iteration in it (waited for up to ``max_ddp_hold`` steps)."""
        series = [self._ranks.get(r) for r in sorted(ranks)]
        if not series or any(s is None or not s.points for s in series):
            return None
        points = {r: s.points for r, s in zip(sorted(ranks), series, strict=True) if s is not None}
        end = min(p[-1].steps for p in points.values())
        start = self.start if self.start is not None else max(p[0].steps for p in points.values())
        span = end - start
        if span < self.min_intervals or self._tried == (self.start, end):
            return None  # too short, or no rank's series moved its end since it was found not ready
        self._tried = (self.start, end)
        if any(p[0].steps > start for p in points.values()):
            self.start = None  # a rank's series begins after the start (it restarted): from the latest first point
            return None
        loose = span / GAP_SHARE
        if any(_gap(p, start) > loose or _gap(p, end) > loose for p in points.values()):
            return None  # the ends are known too loosely yet: a longer window will do
        windows = []
        for rank, series_ in points.items():
            first, last = at_step(series_, start), at_step(series_, end)
            assert first is not None and last is not None  # within every series (checked above)
            window = rank_window(rank, first[0], last[0])
            if window is None or window.intervals < self.min_intervals:
                return None  # a rank without counted steps in it (an evaluation): wait
            windows.append(window)
        ddp = all(Sources.DDP in p[-1].sources for p in points.values())
        if ddp and any(w.ddp_samples == 0 for w in windows) and span < self.max_ddp_hold:
            return None
        self.start = end
        for series_ in points.values():
            i = bisect.bisect_right(series_, end, key=lambda p: p.steps)
            del series_[: max(0, i - 1)]  # the points before the one at or before the new start
        return windows


def _bracket(points: Sequence[StepTotals], step: int) -> tuple[int, int] | None:
    """The indices of the two points ``step`` lies between (the same one twice where a point is at
    ``step``); None outside the points."""
    i = bisect.bisect_left(points, step, key=lambda p: p.steps)
    if i < len(points) and points[i].steps == step:
        return i, i
    if i == 0 or i == len(points):
        return None
    return i - 1, i


def _gap(points: Sequence[StepTotals], step: int) -> float:
    """The gap in steps between the two points ``step`` lies between (0 at a point; infinite
    outside them)."""
    found = _bracket(points, step)
    return float("inf") if found is None else points[found[1]].steps - points[found[0]].steps


def _restarted(points: Sequence[StepTotals], totals: StepTotals) -> bool:
    """A point of a process not known (no pid) that lies below every kept one: another process."""
    return bool(points) and totals.steps < points[0].steps


class NodePoints:
    """A node's side: its ranks' totals as read between two pings (each read a point where the
    rank published since the last), handed to the next ping spread over the steps they cover. One
    owner at a time (the node logger's lock)."""

    def __init__(self, per_take: int = NODE_POINTS) -> None:
        self.per_take = per_take
        self._points: dict[tuple[str, int], tuple[int, list[StepTotals]]] = {}

    def add(self, key: str, rank: int, pid: int, totals: StepTotals) -> None:
        """One read of ``rank`` of the attempt ``key`` (its process ``pid``)."""
        held = self._points.get((key, rank))
        if held is None or held[0] != pid or totals.steps < held[1][-1].steps:
            self._points[(key, rank)] = (pid, [totals])
            return
        points = held[1]
        if totals.steps == points[-1].steps:
            points[-1] = totals  # read again: the same step (published again with DDP's timers read)
        else:
            points.append(totals)
            if len(points) > 4 * self.per_take:
                thin(points)

    def take(self, keys: Collection[str] | None = None) -> dict[str, tuple[RankSteps, ...]]:
        """The points since the last take of each rank (of ``keys``, where given), at most
        ``per_take`` a rank, spread evenly by step count with the first and the latest; the latest
        stays as the next take's first."""
        out: dict[str, list[RankSteps]] = {}
        for (key, rank), (pid, points) in list(self._points.items()):
            if keys is not None and key not in keys:
                del self._points[(key, rank)]
                continue
            out.setdefault(key, []).extend(RankSteps(rank, t, pid) for t in spread(points, self.per_take))
            del points[:-1]
        return {key: tuple(steps) for key, steps in out.items()}


def thin(points: list[StepTotals]) -> None:
    """Remove the inner point whose neighbours are nearest (by step count): the series keeps its
    ends and its points as evenly spread as they can be (a rank read for long with no window)."""
    if len(points) < 3:
        return
    i = min(range(1, len(points) - 1), key=lambda k: points[k + 1].steps - points[k - 1].steps)
    del points[i]


def spread(points: Sequence[StepTotals], n: int) -> list[StepTotals]:
    """At most ``n`` of ``points`` (in step order), the first and the last among them, the rest
    those nearest to evenly spaced step counts between."""
    if len(points) <= n:
        return list(points)
    first, last = points[0].steps, points[-1].steps
    picked: list[StepTotals] = []
    for i in range(n):
        target = first + (last - first) * i / (n - 1)
        j = bisect.bisect_left(points, target, key=lambda p: p.steps)
        candidates = [points[k] for k in (j - 1, j) if 0 <= k < len(points)]
        best = min(candidates, key=lambda p: abs(p.steps - target))
        if not picked or best.steps > picked[-1].steps:
            picked.append(best)
    return picked
