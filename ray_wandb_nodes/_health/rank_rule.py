"""The slow-rank rule (pure): which rank the job waits for, held for a window before it is said,
and said once an episode, with the words of its alerts.

Each call to :meth:`RankRule.judge` is one sample: one set of windows over the same steps,
attributed (``_steps.attribution``) with the rule's threshold. A rank is flagged once it has been
slow (it costs the job at least ``1 - threshold`` of every step) for ``window_s`` and at least
``min_samples`` samples in a row, and recovers once it has been no slower for as long: the hysteresis every health rule
shares (``rule.advance``). The rule takes the node rule's ``straggler_threshold`` and
``straggler_window_s``: "how much worse, for how long" is one notion of a straggler, a node or a
rank, and the two rules must agree on it for one slow rank to be one alert.

Ranks flagged in one sample with one cause are one alert (``Slow ranks: ranks 4-7 on node-b``);
ranks on several nodes, one alert that counts them. When every rank waits long and none is
late, and the waits have grown past the attempt's own pace by what costs the job the same share
of every step, communication itself is slow: one alert of its own, with its own episode
(``comm_rule``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .._hang import rank_ranges
from .._steps import Attribution, Cause, RankFinding, RankWindow, attribute
from .alerts import Alert
from .comm_rule import CommRule
from .comm_rule import ms_text as _ms
from .kinds import EventKind
from .rule import NodeStreak, advance

LIST_LIMIT = 40  # ranks listed in a grouped alert; past it, counted
TITLE_MAX = 63  # W&B's limit on an alert title: under 64 characters

_DOES = {  # (one rank, several ranks, one rank before)
    Cause.INPUT: ("waits on its input", "wait on their input", "waited on its input"),
    Cause.COMPUTE: (
        "is slow to compute (forward and backward)",
        "are slow to compute (forward and backward)",
        "was slow to compute",
    ),
    Cause.OPTIMIZER: ("is slow in its optimizer step", "are slow in their optimizer step", "was slow in its optimizer"),
    Cause.OTHER: (
        "is slow outside its input, compute and optimizer",
        "are slow outside their input, compute and optimizer",
        "was slow outside its input, compute and optimizer",
    ),
}


class RankState(str, enum.Enum):
    """A rank's state in the ``ranks`` table."""

    OK = "ok"
    SLOW = "slow"  # the job waits for it, for the window
    UNMEASURED = "unmeasured"  # no window of it judged yet

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs, as the run names it."""

    node: str  # its node's label
    gpu: int | None = None  # the NVML index of its GPU; None: none, or not known


@dataclass
class _Episode:
    streak: NodeStreak = field(default_factory=NodeStreak)
    said: RankFinding | None = None  # what its alert said, while flagged


class RankRule:
    """The slow-rank rule of one run, and the streak each rank is on. One owner: the thread that
    judges the run's health."""

    def __init__(self, threshold: float = 0.7, window_s: float = 120.0, min_samples: int = 3) -> None:
        self.threshold, self.window_s, self.min_samples = threshold, window_s, min_samples
        self._ranks: dict[int, _Episode] = {}
        self.comm = CommRule(threshold, window_s, min_samples)
        self.latest: Attribution | None = None

    def judge(
        self, windows: Sequence[RankWindow], now: float, places: Mapping[int, RankPlace], complete: bool = True
    ) -> list[Alert]:
        """One sample, the ranks' windows over the same steps: the alerts it raises (a WARN when
        ranks turn slow, an INFO when they keep pace again), grouped by cause; none while nothing
        flips. Windows that cannot be compared (one rank, ranks not in step) are no sample.
        ``complete``: every rank of the job is in ``windows``; where one is not (not read), slow
        communication is not judged: the rank left out may be the one the others wait for."""
        attribution = attribute(windows, self.threshold)
        if attribution.basis is None:
            return []
        self.latest = attribution
        flagged: dict[Cause, list[RankFinding]] = {}
        recovered: list[tuple[int, RankFinding, float | None]] = []
        for window in attribution.windows:
            rank = window.rank
            finding = attribution.finding(rank)
            episode = self._ranks.setdefault(rank, _Episode())
            if not advance(episode.streak, finding is not None, 1, now, now, self.window_s, self.min_samples):
                continue
            if episode.streak.flagged and finding is not None:
                episode.said = finding
                flagged.setdefault(finding.cause, []).append(finding)
            elif episode.said is not None:
                recovered.append((rank, episode.said, attribution.lateness_s.get(rank)))
                episode.said = None
        alerts = [_slow_alert(findings, attribution, places) for findings in flagged.values()]
        if recovered:
            alerts.append(_recovered_alert(recovered, places))
        comm = self.comm.judge(attribution, now) if complete else None
        return alerts + ([comm] if comm is not None else [])

    def state(self, rank: int) -> RankState:
        episode = self._ranks.get(rank)
        if episode is None:
            return RankState.UNMEASURED
        return RankState.SLOW if episode.streak.flagged else RankState.OK

    def slow_ranks(self) -> frozenset[int]:
        """The ranks flagged now (for the node and GPU rules: one slow rank, one alert)."""
        return frozenset(rank for rank, e in self._ranks.items() if e.streak.flagged)

    def forget(self, rank: int) -> None:
        """A rank gone (its worker group ended): its episode ends unsaid."""
        self._ranks.pop(rank, None)

    def restart(self) -> None:
        """Another attempt or placement: communication's pace is set again (``comm_rule``)."""
        self.comm.restart()


# words ------------------------------------------------------------------------------------------
def where(rank: int, places: Mapping[int, RankPlace], gpu: bool = True) -> str:
    """``rank 2 on node-gpu-b-7a8b9c`` (``(GPU 1)`` after it where known and ``gpu``)."""
    place = places.get(rank)
    if place is None:
        return f"rank {rank}"
    on = f"rank {rank} on {place.node}"
    return f"{on} (GPU {place.gpu})" if gpu and place.gpu is not None else on


def finding_text(f: RankFinding, step_s: float, basis: str) -> str:
    """What a slow rank does and what it costs (after its name): ``waits on its input: 240 ms of
    a 290 ms step (the other ranks' median: 4 ms); ...``."""
    does = _DOES[f.cause][0] if f.cause in _DOES else f"is slow in {f.cause}"
    figures = f"{_ms(f.part_s)} of a {_ms(step_s)} step (the other ranks' median: {_ms(f.others_part_s)})"
    if basis == "wait":
        cost = (
            f"The other ranks wait {_ms(f.lateness_s)} a step for it in their collectives: the job loses "
            f"{_pct(f.impact)} of every step to it."
        )
    else:
        cost = (
            f"The job loses about {_pct(f.impact)} of every step to it (from its {f.cause} alone: this training "
            "has no DDP, whose timers measure how long each rank waits)."
        )
    return f"{does}: {figures}. {cost}"


def _slow_alert(findings: list[RankFinding], a: Attribution, places: Mapping[int, RankPlace]) -> Alert:
    findings = sorted(findings, key=lambda f: f.rank)
    first = findings[0]
    steps = _steps_of(a)
    basis = a.basis or "wait"
    if len(findings) == 1:
        title = f"Slow rank: {where(first.rank, places, gpu=False)}"
        text = f"{_cap(where(first.rank, places))} {finding_text(first, a.step_s, basis)} {steps}"
        return _alert(title, text, "WARN", [first.rank], places, EventKind.SLOW_RANK)
    ranks = [f.rank for f in findings]
    who = _who(ranks, places)
    lines = [f"{_cap(who)} {_DOES[first.cause][1] if first.cause in _DOES else first.cause}. {steps}"]
    lines += [f"- {where(f.rank, places)} {finding_text(f, a.step_s, basis)}" for f in findings[:LIST_LIMIT]]
    if len(findings) > LIST_LIMIT:
        lines.append(f"- and {len(findings) - LIST_LIMIT} more ranks")
    return _alert(f"Slow ranks: {who}", "\n".join(lines), "WARN", ranks, places, EventKind.SLOW_RANK)


def _recovered_alert(recovered: list[tuple[int, RankFinding, float | None]], places: Mapping[int, RankPlace]) -> Alert:
    recovered.sort(key=lambda r: r[0])
    ranks = [rank for rank, _, _ in recovered]
    lines = []
    for rank, said, late in recovered[:LIST_LIMIT]:
        if late is None:
            now = "its wait is not measured"
        elif late <= 0:
            now = "it arrives no later than the median rank"
        else:
            now = f"it arrives {_ms(late)} a step after the median rank"
        before = _DOES[said.cause][2] if said.cause in _DOES else f"was slow in {said.cause}"
        lines.append(f"{_cap(where(rank, places))} keeps pace again: {now} (it {before}).")
    if len(recovered) > LIST_LIMIT:
        lines.append(f"And {len(recovered) - LIST_LIMIT} more ranks.")
    noun = "Slow rank recovered" if len(ranks) == 1 else "Slow ranks recovered"
    who = where(ranks[0], places, gpu=False) if len(ranks) == 1 else _who(ranks, places)
    return _alert(f"{noun}: {who}", "\n".join(lines), "INFO", ranks, places, EventKind.SLOW_RANK, recovered=True)


def _who(ranks: list[int], places: Mapping[int, RankPlace]) -> str:
    """``ranks 4-7 on node-b``, or ``12 ranks on 3 nodes``."""
    nodes = sorted({places[r].node for r in ranks if r in places})
    if len(nodes) <= 1:
        on = f" on {nodes[0]}" if nodes else ""
        return f"ranks {rank_ranges(ranks)}{on}"
    return f"{len(ranks)} ranks on {len(nodes)} nodes"


def _alert(
    title: str,
    text: str,
    level: str,
    ranks: list[int],
    places: Mapping[int, RankPlace],
    kind: EventKind,
    recovered: bool = False,
) -> Alert:
    nodes = sorted({places[r].node for r in ranks if r in places})
    node = nodes[0] if len(nodes) == 1 else f"{nodes[0]}+{len(nodes) - 1}" if nodes else ""
    gpus = tuple(sorted({g for r in ranks if (g := _gpu(places, r)) is not None})) if len(nodes) == 1 else ()
    return Alert(title[:TITLE_MAX], text, level, node, kind, recovered, gpus)


def _gpu(places: Mapping[int, RankPlace], rank: int) -> int | None:
    place = places.get(rank)
    return place.gpu if place is not None else None


def _steps_of(a: Attribution) -> str:
    first = min((w.first_step for w in a.windows), default=0)
    last = max((w.last_step for w in a.windows), default=0)
    return f"Over steps {first:,} to {last:,}."


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"
