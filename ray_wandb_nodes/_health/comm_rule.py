"""Slow communication (pure): every rank waits long in its collectives, none arrives late, and
the waits have grown well past the attempt's own pace; one alert an episode, and its recovery.

A job's collectives take what its design makes them take: FSDP2 over a CPU's gloo, a small model
on a large fleet, a network slower than the model needs. That share of a step is the job's pace,
not a fault. What the alert is for is a change: a link that degrades, a switch, another team's
traffic on the same fabric. So each attempt sets its **pace** first, the median of the median
rank's wait over its first :data:`PACE_WINDOWS` windows (a median: no one lucky or unlucky
window sets it; each window on CUDA is one timed iteration), and no window is judged before it.

Then communication is slow where, for ``window_s`` and ``min_samples`` windows in a row
(``rule.advance``):

- every rank waits at least ``1 - threshold`` of its step, and none is late;
- the median rank waits at least :data:`COMM_GROWTH` times the pace;
- what it waits past the pace **costs** the job at least ``1 - threshold`` of every step: the bar
  a slow rank is held to (``straggler_threshold``: the job keeps less than ``threshold`` of its
  step rate).

It recovers once the median wait has stayed under :data:`RECOVER_GROWTH` times the pace, or its
cost under :data:`RECOVER_COST` of that bar, as long: a margin on both, so that a fabric near the
bar does not flap, and the everyday waits after an episode do not hold it open for good. A window
where a rank is late says nothing of the fabric: it leaves the streak as it is. Another attempt
(a restart, a resize) sets its pace again, and so does a change of the passes a step (a
micro-batch ramp: every pass's collectives come again) outside an episode.

The cost is what tells a slow fabric from some noise: ranks that take turns arriving late
(scheduling on a loaded host) wait for each other with no rank late on the whole, some
milliseconds a step past a small pace. It does not tell every case: at thousands of ranks,
stalls of one rank at a time (a slow storage read, a garbage collection, a container's CPU
quota) come in almost every step, every rank waits for them, none is late over a window, and
once they grow past the bar the alert says so; its words name them with the network.

What it cannot tell: communication slow from an attempt's first windows (a bad link the job
lands on) is that attempt's pace; the ``ranks`` table's ``comm_wait_ms`` shows the share. A wait
that doubles where it was already a large share of the step costs the job less than the bar
(a pace of 40 % of the step, doubled, costs 29 %): said once it costs the bar.
"""

from __future__ import annotations

import statistics

from .._steps import Attribution, CommFinding
from .alerts import Alert
from .kinds import EventKind
from .rule import NodeStreak, advance

PACE_WINDOWS = 8  # an attempt's first windows that set its pace (at window_s / 8 a window: one window_s)
COMM_GROWTH = 2.0  # slow once the median wait is twice the pace
RECOVER_GROWTH = 1.5  # recovered once it stays under one and a half times the pace
RECOVER_COST = 0.5  # or once its cost stays under half the bar (15 % of a step by default)
PASSES_CHANGE = 1.5  # passes a step that change by this factor set the pace again
PACE_FLOOR_S = 0.002  # a pace under 2 ms a step is taken as 2 ms (scheduling noise; never a zero)


class CommRule:
    """The slow-communication judgement of one run's current attempt. One owner: the thread that
    judges the run's health."""

    def __init__(self, threshold: float = 0.7, window_s: float = 120.0, min_samples: int = 3) -> None:
        self.share, self.window_s, self.min_samples = 1.0 - threshold, window_s, min_samples
        self._streak = NodeStreak()
        self._early: list[tuple[float, int, int]] = []  # (median wait, first step, last step) a window
        self.pace_s: float | None = None  # set once PACE_WINDOWS windows were seen
        self._pace_steps = (0, 0)
        self._pace_passes: float | None = None  # the passes a step while the pace was set, where timed

    def restart(self) -> None:
        """Another attempt or placement: its pace is set again (an episode under way ends unsaid,
        as the ranks' do)."""
        self._streak, self._early, self.pace_s, self._pace_passes = NodeStreak(), [], None, None

    def judge(self, attribution: Attribution, now: float) -> Alert | None:
        """One complete set of windows over the same steps: a WARN when communication turns slow,
        an INFO when it recovers, else None."""
        if attribution.basis != "wait":
            return None  # no wait measured: communication is not judged
        median = statistics.median((w.wait_s or 0.0) for w in attribution.windows)
        passes = _passes(attribution)
        if self.pace_s is not None and not self._streak.flagged and _changed(self._pace_passes, passes):
            self.restart()  # a micro-batch ramp: the collectives a step change with the passes
        if self.pace_s is None:
            self._set_pace(attribution, median, passes)
            return None
        if attribution.slow:
            return None  # a rank is late: this window says nothing of the fabric
        comm = attribution.communication
        growth = median / self.pace_s
        cost = (median - self.pace_s) / attribution.step_s if attribution.step_s > 0 else 0.0
        if self._streak.flagged:
            slower = growth >= RECOVER_GROWTH and cost >= RECOVER_COST * self.share
        else:
            slower = comm is not None and growth >= COMM_GROWTH and cost >= self.share
        if not advance(self._streak, slower, 1, now, now, self.window_s, self.min_samples):
            return None
        if self._streak.flagged and comm is not None:
            return self._alert(comm, attribution.step_s, cost)
        return Alert(
            "Slow communication recovered",
            f"The median rank waits {ms_text(median)} a step in its collectives again, {growth:.1f} times the "
            f"attempt's pace ({ms_text(self.pace_s)}), of a {ms_text(attribution.step_s)} step: the job loses "
            f"{max(0.0, cost) * 100:.0f} % of every step to it.",
            "INFO",
            "",
            EventKind.SLOW_COMMUNICATION,
            recovered=True,
        )

    def _set_pace(self, attribution: Attribution, median: float, passes: float | None) -> None:
        first = min((w.first_step for w in attribution.windows), default=0)
        last = max((w.last_step for w in attribution.windows), default=0)
        self._early.append((median, first, last))
        if len(self._early) >= PACE_WINDOWS:
            self.pace_s = max(PACE_FLOOR_S, statistics.median(m for m, _, _ in self._early))
            self._pace_steps = (self._early[0][1], self._early[-1][2])
            self._pace_passes = passes
            self._early = []

    def _alert(self, comm: CommFinding, step_s: float, cost: float) -> Alert:
        assert self.pace_s is not None
        first, last = self._pace_steps
        text = (
            f"Every rank waits in its collectives: at least {ms_text(comm.least_wait_s)} of a {ms_text(step_s)} step "
            f"({comm.share * 100:.0f} %), the median rank {ms_text(comm.wait_s)}: "
            f"{comm.wait_s / self.pace_s:.1f} times the attempt's pace ({ms_text(self.pace_s)} a step over steps "
            f"{first:,} to {last:,}), and no rank arrives late: the job loses "
            f"{cost * 100:.0f} % of every step to it. Communication itself became slow (a link or a "
            "switch, or traffic sharing the network), or ranks take turns arriving late, a different one each step "
            "(a slow read, a garbage collection, a CPU quota)."
        )
        return Alert("Slow communication", text, "WARN", "", EventKind.SLOW_COMMUNICATION)


def _passes(attribution: Attribution) -> float | None:
    """The median rank's passes a step (micro-batches), where timed."""
    known = [w.passes for w in attribution.windows if w.passes is not None]
    return statistics.median(known) if known else None


def _changed(before: float | None, now: float | None) -> bool:
    """Passes a step that changed by :data:`PASSES_CHANGE` or more (unknown on either side: not)."""
    if before is None or now is None or before <= 0 or now <= 0:
        return False
    return max(before, now) / min(before, now) >= PASSES_CHANGE


def ms_text(seconds: float | None) -> str:
    """``240 ms``, ``4.0 ms`` (a tenth under 10 ms), ``n/a`` where not known: the alerts' figures."""
    if seconds is None:
        return "n/a"
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if abs(ms) >= 10 else f"{ms:.1f} ms"
