"""When a suspicion is a hang (pure): the policy re-run on fresh readings, the back-off between
evidence rounds, and the place a verdict names (a restart ends an attempt once for one place).

A node's ping brings its ranks' progress as it was when the node read their beacons; at 1,000
nodes a ping is up to about 47 s old, so a rank judged on it is only *suspected*. A hang is raised
only when readings taken after the limit passed still show no progress:

- **proven**: the policy (:func:`~.policy.job_hung`) applied to the readings *as taken* (their
  ages at the reading, not aged since) finds a hung rank; a suspicion that is not proven asks for
  fresher readings (a ping now) and waits;
- **still hung**: every node's evidence round reads each rank again; the policy is re-run on those
  readings, and a rank stays hung only if its counts (process, reports, steps) are those of the
  suspicion: a rank that moved, or a new process (a restart), drops the suspicion without a word.

Ranks whose node gave no answer in the round cannot prove progress, nor a hang: they enter the
policy with their last readings (so a rank of theirs in a checkpoint within its limit still holds
the others), but only an answered rank can be still hung. One silent node never makes a hang of a
job whose other ranks moved; a stopped rank on a silent node is named once its peers, which wait
for it, are proven silent themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .beacon import RankProgress
from .policy import HangTimeout, job_hung
from .verdict import Verdict

Counts = tuple[int, int, int]  # (pid, reports, steps): a rank's process and how far it got
# A hang's place: each stopped rank's function and line, and its reports since the checkpoint its
# attempt last reported or started from (a beacon counts from zero in each process, and an
# attempt restarts from the last checkpoint: the counts since it compare across attempts). Ranks
# are left out: the same data shard stops whichever rank reads it.
Place = frozenset[tuple[str, int]]

# The first back-off after an evidence round that did not confirm its suspicion (a fixed limit
# shorter than this backs off by the limit), and the longest, as it doubles for the same suspicion.
BACKOFF_S = 60.0
MAX_BACKOFF_S = 600.0


def counts_of(progress: RankProgress) -> Counts:
    return (progress.pid, progress.reports, progress.steps)


def still_hung(
    setting: HangTimeout,
    fresh: Sequence[RankProgress],
    unanswered: Sequence[RankProgress],
    before: Mapping[int, Counts],
    pg_timeout_s: float | None = None,
) -> list[RankProgress]:
    """The ranks that ``fresh`` readings (taken after the suspicion) show hung and unmoved since
    ``before`` (each rank's counts at the suspicion); ``unanswered``: the last readings (aged) of
    ranks whose node gave none, which hold the others when in a long phase within their limit but
    are never hung themselves. Empty: no hang."""
    answered = {p.rank for p in fresh}
    hung = job_hung(setting, [*fresh, *(p for p in unanswered if p.rank not in answered)], pg_timeout_s)
    return [p for p in hung if p.rank in answered and before.get(p.rank) == counts_of(p)]


def backoff_s(setting: HangTimeout, misses: int) -> float:
    """How long after an evidence round that confirmed nothing the same suspicion waits for the
    next (``misses`` such rounds in a row), and any other suspicion after the first."""
    base = min(BACKOFF_S, setting.seconds) if setting.seconds is not None else BACKOFF_S
    return min(MAX_BACKOFF_S, base * float(2 ** max(0, misses - 1)))


@dataclass
class Rounds:
    """The evidence rounds of one run's suspicions: one now, or not before a back-off. A round
    that confirms nothing backs its suspicion off (doubling while the same ranks stay suspected
    with the same counts); any other suspicion waits the first back-off from it."""

    last: frozenset[tuple[int, Counts]] | None = None
    at: float = float("-inf")
    misses: int = 0

    def due(self, setting: HangTimeout, key: frozenset[tuple[int, Counts]], now: float) -> bool:
        wait = backoff_s(setting, self.misses if key == self.last else 1) if self.misses else 0.0
        return now - self.at >= wait

    def missed(self, key: frozenset[tuple[int, Counts]], now: float) -> None:
        self.misses = self.misses + 1 if key == self.last else 1
        self.last, self.at = key, now

    def confirmed(self) -> None:
        self.last, self.misses = None, 0


def suspicion_key(ranks: Iterable[RankProgress]) -> frozenset[tuple[int, Counts]]:
    return frozenset((p.rank, counts_of(p)) for p in ranks)


def place_of(verdict: Verdict, checkpoint_reports: int = 0) -> Place | None:
    """Where ``verdict``'s stopped ranks are: each one's function and line, and its reports since
    its attempt's last checkpoint (``checkpoint_reports``: the attempt's reports when it reported
    that checkpoint; 0 before any, the attempt then runs from the checkpoint it was restored
    from); None when a stopped rank's stack is unknown (no place to compare)."""
    stopped = set(verdict.stopped)
    rows = [row for row in verdict.rows if row.rank in stopped]
    if not rows or any(row.where == "no stack" for row in rows):
        return None
    return frozenset((row.where, row.reports - checkpoint_reports) for row in rows)


def describe_place(place: Place) -> str:
    """``load_next_shard (train.py:71), 2 reports after the checkpoint``, each place once."""
    return "; ".join(
        f"{where}, {n} report{'' if n == 1 else 's'} after the checkpoint its attempt ran from"
        for where, n in sorted(place)
    )
