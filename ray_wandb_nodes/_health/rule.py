"""The straggler rule (pure): which node stays worse than the others, and when it recovers.

Each node's value is compared with the median of the *other* nodes' values (so with two nodes
each compares to the other). ``MAX`` (higher is better, as throughput or GPU utilisation): a
value is worse when below ``threshold`` x that median; ``MIN`` (lower is better, as step time):
worse when above the median / ``threshold``. A difference under ``floor`` never counts (idle
nodes differ by noise). A node becomes a straggler once its values have been
worse for ``window_s`` and at least ``min_samples`` samples in a row; it recovers once they have
been no worse for as long. The rule only sees numbers: which value a node has is the monitor's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._config.values import StragglerMode
from .._stats import median_without
from .kinds import EventKind

__all__ = ["NodeStreak", "StragglerRule", "advance", "judge"]


@dataclass(frozen=True)
class StragglerRule:
    mode: StragglerMode = StragglerMode.MAX
    threshold: float = 0.7
    window_s: float = 120.0
    min_samples: int = 3
    floor: float = 0.0

    def worse(self, value: float, median: float) -> bool:
        """Whether ``value`` is worse than the others' ``median`` by the rule."""
        if abs(value - median) <= self.floor:
            return False
        if self.mode.higher_is_better:
            return value < self.threshold * median
        return value > median / self.threshold


@dataclass
class NodeStreak:
    """One node's run of worse (or, while flagged, no-worse) samples."""

    flagged: bool = False
    since: float | None = None  # when the current run began
    samples: int = 0
    median: float | None = None  # the others' median at the last sample

    def reset(self) -> None:
        self.since, self.samples = None, 0


def judge(
    rule: StragglerRule,
    streaks: dict[str, NodeStreak],
    values: Mapping[str, float],
    fresh: Mapping[str, int],
    now: float,
    spans: Mapping[str, tuple[float, float] | None] | None = None,
) -> list[tuple[str, EventKind]]:
    """Advance every node with fresh samples; the events: ``(node, STRAGGLER | RECOVERED)``.

    ``values`` holds every compared node's current value; ``fresh`` how many new samples each
    node's value stands for (nodes absent from it are not judged now); ``spans``, when a node's
    samples say when they were taken (first, last), the window is measured over those times,
    else at ``now``. ``streaks`` is updated.
    """
    events: list[tuple[str, EventKind]] = []
    ordered = sorted(values.values())  # once: each node's "others" is this less its own value
    for node, count in sorted(fresh.items()):
        if node not in values or count <= 0 or len(ordered) < 2:
            continue
        median = median_without(ordered, values[node])
        streak = streaks.setdefault(node, NodeStreak())
        streak.median = median
        start, end = (spans or {}).get(node) or (now, now)
        if advance(streak, rule.worse(values[node], median), count, start, end, rule.window_s, rule.min_samples):
            events.append((node, EventKind.STRAGGLER if streak.flagged else EventKind.RECOVERED))
    return events


def advance(
    streak: NodeStreak, worse: bool, count: int, start: float, end: float, window_s: float, min_samples: int
) -> bool:
    """The hysteresis every health rule shares: ``count`` new samples, taken from ``start`` to
    ``end``, that are ``worse`` or not. A flagged streak counts samples that are no longer worse,
    another those that are; a run of them long enough (``window_s`` and ``min_samples``) flips
    the flag. Whether it flipped (``streak`` is updated)."""
    if worse == streak.flagged:
        streak.reset()
        return False
    if streak.since is None:
        streak.since = start
    streak.samples += count
    if streak.samples >= min_samples and end - streak.since >= window_s:
        streak.flagged = not streak.flagged
        streak.reset()
        return True
    return False
