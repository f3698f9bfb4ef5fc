"""One run's ranks, judged on the driver side (pure): every rank's step totals as its node read
them, kept as points by step count and made into windows over the same steps
(``_steps.StepMarks``) and judged by the rank rule (``rank_rule``), with where each rank runs;
what the run is told of them (the rule's alerts, the ``ranks`` table, the history keys) and the
nodes and GPUs the rule speaks for (:meth:`claims`: one slow rank, one alert; see ``claims``).

Fed by the fleet thread each poll with the points of every rank of the run's current attempt
that its nodes' pings brought (several a rank, each at the steps it covers); a window forms once
every placed rank has points past the last window's end (a rank not read makes no window: the
rank that is not read may be the one the others wait for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .._steps import Attribution, RankSteps, StepMarks, StepTotals
from .alerts import Alert
from .rank_rule import RankPlace, RankRule
from .rank_table import rank_history, rank_rows

UNREAD_S = 180.0  # a rank whose points stopped coming this long, while others' came, is left out (unmeasured)
JUDGEMENTS_A_WINDOW = 8  # the rule's samples over its window_s at most (it needs 3 in a row: rank_rule)
HISTORY_EVERY_S = 15.0  # the history keys at most this often (the run's sampling interval: HealthOptions)
PATIENCE_JUDGEMENTS = 3  # a node or GPU alert waits at most this many of the rule's intervals for its word


class RankAt(NamedTuple):
    """Where a rank of the run's current attempt runs: its node's id and label."""

    node_id: str
    label: str


class RankHealth:
    """The slow-rank side of one run's health. One owner: the thread that judges the run."""

    def __init__(
        self, threshold: float = 0.7, window_s: float = 120.0, history_every_s: float = HISTORY_EVERY_S
    ) -> None:
        self.rule = RankRule(threshold, window_s)
        self.window_s = window_s
        self.history_every_s = history_every_s
        self._marks = StepMarks()
        self._attempt: str | None = None
        self._moved: dict[int, tuple[int, float]] = {}  # each rank's latest step count and when it came
        self._windowed_at: float | None = None  # when the last window was made (judged or not)
        self._first_at: float | None = None  # when the attempt's first point came
        self.unread: frozenset[int] = frozenset()  # ranks left out of the windows: not read for UNREAD_S
        self._at: dict[int, RankAt] = {}
        self.places: dict[int, RankPlace] = {}
        self.judged = 0  # judgements made (windows the rule could compare)
        self._judged_at: list[float] = []  # when the last two were made
        self._alerts: list[Alert] = []
        self._history_at: float | None = None
        self._history_judged = 0  # the judgements the last history keys were of
        self._history_slow = 0

    # what the fleet feeds it ------------------------------------------------------------------
    def read(
        self,
        steps: Mapping[int, StepTotals] | Iterable[RankSteps],
        at: Mapping[int, RankAt],
        now: float,
        gpu_of: Callable[[str, int], int | None] | None = None,
        attempt: str | None = None,
    ) -> None:
        """The ranks' points as their nodes read them (``RankSteps``, several a rank in step order;
        or the latest totals by rank) and where each rank of the current attempt runs (``at``);
        ``gpu_of(node id, rank)``: the NVML index of a rank's GPU; ``attempt``: the attempt's key
        (another attempt's ranks start their series again, wherever they run). Judged once every
        rank of ``at`` has points past the last window's end; a rank whose points stopped coming
        for ``UNREAD_S`` while the others' came (its node's logger gone, its anatomy off) is left
        out, and the others judged without it."""
        if dict(at) != self._at or attempt != self._attempt:  # another placement or attempt: start again
            for rank in self._at.keys() - at.keys():
                self.rule.forget(rank)
                self.places.pop(rank, None)
            self._marks, self._at, self._attempt, self._moved = StepMarks(), dict(at), attempt, {}
            self.rule.restart()
            self._first_at = None
        if isinstance(steps, Mapping):
            steps = [RankSteps(rank, totals) for rank, totals in steps.items()]
        self._marks.add_all(s for s in steps if s.rank in at)
        if not at or (self._windowed_at is not None and now - self._windowed_at < self.window_s / JUDGEMENTS_A_WINDOW):
            return  # a window every window_s / 8 at most: at 8,000 ranks a window is 0.1 s of the fleet thread
        judged = self._judged_ranks(at, now)
        windows = self._marks.advance(judged)  # None while a rank is not read (it may be the one waited for)
        if windows is None:
            return
        self._windowed_at = now
        self.places = {r: RankPlace(a.label, gpu_of(a.node_id, r) if gpu_of else None) for r, a in at.items()}
        before = self.rule.latest
        self._alerts += self.rule.judge(windows, now, self.places, complete=not self.unread)
        if self.rule.latest is not before:
            self.judged += 1
            self._judged_at = [*self._judged_at[-1:], now]

    def _judged_ranks(self, at: Mapping[int, RankAt], now: float) -> set[int]:
        """The ranks of ``at`` to judge: every one, less those whose points stopped coming for
        ``UNREAD_S`` while another rank's came (then ``unread``)."""
        for rank in at:
            latest = self._marks.latest(rank)
            if latest is not None and (rank not in self._moved or self._moved[rank][0] != latest.steps):
                self._moved[rank] = (latest.steps, now)
        if not self._moved:
            return set(at)
        self._first_at = now if self._first_at is None else self._first_at
        newest = max(t for _, t in self._moved.values())
        unread = {r for r in at if newest - (self._moved[r][1] if r in self._moved else self._first_at) > UNREAD_S}
        if unread and len(unread) < len(at):
            self.unread = frozenset(unread)
            return set(at) - unread
        self.unread = frozenset()
        return set(at)

    # what it says -----------------------------------------------------------------------------
    @property
    def measured(self) -> bool:
        """Whether the rule has judged the run's ranks (a ``ranks`` table is worth logging)."""
        return self.judged > 0

    @property
    def latest(self) -> Attribution | None:
        return self.rule.latest

    def take_alerts(self) -> list[Alert]:
        """The rule's alerts since the last call."""
        alerts, self._alerts = self._alerts, []
        return alerts

    def rows(self) -> list[list[Any]]:
        """The ``ranks`` table now: every rank of the current attempt."""
        return rank_rows(self._at, self.rule.latest, self.places, self.rule.state)

    def history(self, now: float, final: bool = False) -> dict[str, float] | None:
        """The history keys of the latest judgement, when one came since the last keys were given
        and ``history_every_s`` has passed (at once when the slow count changed, and at the end);
        None otherwise."""
        if self.judged == self._history_judged:
            return None
        slow = len(self.rule.slow_ranks())
        waited = self._history_at is not None and now - self._history_at < self.history_every_s
        if waited and slow == self._history_slow and not final:
            return None
        self._history_at, self._history_judged, self._history_slow = now, self.judged, slow
        return rank_history(self.rule.latest, slow)

    # one cause, one alert -----------------------------------------------------------------------
    def active(self, now: float) -> bool:
        """Whether the rule judges this run's ranks now: it judged within :meth:`patience`."""
        return bool(self._judged_at) and now - self._judged_at[-1] <= self.patience()

    def patience(self) -> float:
        """How long a node or GPU alert waits for the rule's next judgement: ``window_s``, or three
        of the rule's recent intervals between judgements where longer (on CUDA, DDP's timers time
        one step in 211: a window may take minutes)."""
        if len(self._judged_at) < 2:
            return self.window_s
        return max(self.window_s, PATIENCE_JUDGEMENTS * (self._judged_at[1] - self._judged_at[0]))

    def claims(self, node_id: str, gpus: tuple[int, ...] = ()) -> bool:
        """Whether the rule speaks of ``node_id`` (of its GPUs ``gpus``, where given): a rank there
        (on one of those GPUs, or on a GPU not known) is slow by the rule, or its latest judgement
        names it (an episode under way)."""
        latest = self.rule.latest
        named = self.rule.slow_ranks() | ({f.rank for f in latest.slow} if latest is not None else set())
        for rank in named:
            at, place = self._at.get(rank), self.places.get(rank)
            if at is None or at.node_id != node_id:
                continue
            if not gpus or place is None or place.gpu is None or place.gpu in gpus:
                return True
        return False
