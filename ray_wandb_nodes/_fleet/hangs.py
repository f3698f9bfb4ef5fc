"""The fleet's side of hang detection: one run's ranks' progress (as the node loggers' pings bring
it, and off the beacons of the controller's own node), the policy applied, every rank's evidence
taken at once when fresh readings prove one past its limit (``_hang/confirm.py``), the verdict
handed to the run's primary, and the end of the episode when progress resumes or the run ends.
Runs on the fleet thread, after each health check.

:class:`HangWatch` holds the order of things and the episode; its jobs are each a module's: the
readings (``hang_reads.py``), the nodes asked (``hang_nodes.py``), the evidence round
(``hang_round.py``), the attempt's ranks ended (``hang_ends.py``) and the views kept for the
failure rule (``hang_views.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._config.values import OnHang
from .._failure import HangView
from .._hang import (
    Counts,
    HangNotice,
    HangTimeout,
    Place,
    RankProgress,
    Rounds,
    counts_of,
    ended_notice,
    job_hung,
    resumed_notice,
    suspicion_key,
)
from .._warn import Warner
from .hang_ends import end_hung_ranks
from .hang_nodes import Ask, Refreshes, ask_loggers
from .hang_reads import Reading, node_ages, read_progress
from .hang_round import EvidenceRound, Judged, gc_paused
from .hang_views import AttemptViews

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun


def poll_s(setting: HangTimeout, default_s: float) -> float:
    """The fleet's poll (and each logger's ping) for a run with ``setting``: a short fixed
    ``hang_timeout_s`` is seen within a sixteenth of it, at most every quarter second."""
    if setting.seconds is None:
        return default_s
    return min(default_s, max(0.25, setting.seconds / 16))


@dataclass(frozen=True)
class HangSetting:
    """How a run's ranks are watched for hangs: what the fleet builds the run's :class:`HangWatch`
    from (a Train run inside a Tune trial publishes it through the hand-off)."""

    timeout: HangTimeout  # the run's ``hang_timeout_s``: a fixed limit, or "auto" (the job's cadence)
    on_hang: OnHang = OnHang.ALERT  # what a hang does past its alert: restart ends its stopped ranks
    pg_timeout_s: float | None = None  # torch's process-group timeout: every limit stays below it

    def watch(self) -> HangWatch:
        """A new watch of this setting (on the fleet thread, which owns it)."""
        return HangWatch(self.timeout, self.on_hang, self.pg_timeout_s)


@dataclass
class HangWatch:
    """One run's hang detection, on the fleet thread (every field is its own; what the Train
    controller learns comes as a command). ``setting`` is its ``hang_timeout_s``; ``pg_timeout_s``
    torch's process-group timeout (every limit stays below it, so the evidence is taken while the
    processes live). It lives as long as the run, across Ray Train's attempts."""

    setting: HangTimeout
    on_hang: OnHang = OnHang.ALERT
    pg_timeout_s: float | None = None
    episode: int = 0  # hangs raised so far
    open: bool = False  # a hang raised and no progress since
    counts: dict[int, Counts] = field(default_factory=dict)  # rank -> (pid, reports, steps) at the hang
    stopped: tuple[int, ...] = ()  # the open hang's stopped ranks
    ended: bool = False  # the open hang's attempt was ended (on_hang="restart")
    raised_at: float = 0.0
    closed_at: float = float("-inf")  # when the last hang ended (the watch's clock)
    # The ranks on each node where the run's own placement does not say (a Train run inside a
    # Tune trial publishes them); None: the run's (``target.ranks``).
    ranks: dict[str, tuple[int, ...]] | None = None
    clock: Callable[[], float] = time.monotonic  # the pool's (a handle's ``progress_at`` is on it)
    # Ranks whose train function returned (Train's poll status; a rank that failed is not one):
    # not judged, and progress during a hang.
    finished: frozenset[int] = frozenset()
    ask: Ask | None = None  # every node's evidence; None: the node loggers', through Ray
    rounds: Rounds = field(default_factory=Rounds)  # the evidence rounds' back-off
    refreshes: Refreshes = field(default_factory=Refreshes)  # pings out of turn for fresher readings
    # The attempt's reports when it reported its last checkpoint (0: none yet; an attempt runs from
    # the checkpoint it was restored from): a hang's place counts its reports since.
    checkpoint_reports: int = 0
    # Each place a hang ended an attempt at (on_hang="restart"), and that hang's number.
    restarted: dict[Place, int] = field(default_factory=dict)
    # Each rank's process as the last evidence round read it: an end names these, and no other.
    judged: dict[int, RankProgress] = field(default_factory=dict)
    # What each attempt's last hang said (by attempt key): the failure rule's judgement of who the
    # others waited for, where that attempt then fails (``_failure.stuck``). The last few only.
    views: AttemptViews = field(default_factory=AttemptViews)
    viewed: str = ""  # the attempt whose view the open hang set (dropped when progress resumes)

    def view(self, key: str | None) -> HangView | None:
        """What the last hang of the attempt ``key`` said of who stopped and who waits (None: none)."""
        return self.views.view(key)

    def check(
        self,
        target: WatchedRun,
        pool: LoggerPool,
        warner: Warner,
        deliver: Callable[[HangNotice], None],
        ask: Ask | None = None,
    ) -> None:
        """Judge the run's ranks now; raise a hang (or its end) through ``deliver``.

        A rank past its limit on its node's last readings is suspected; readings too old to
        prove it are taken again (its node pinged now); readings that prove it start an evidence
        round (every node, at most once a back-off for one suspicion), whose fresh readings decide
        (``_hang/confirm.py``): a hang, or nothing at all."""
        self.refreshes.take(pool, self.clock())
        readings = self.progress(target, pool)
        if not readings:
            return
        now = {rank: reading.now() for rank, reading in readings.items()}
        if target.health is not None:  # the nodes table's last progress of each node
            target.health.progress(node_ages(readings, now))
        if self.open:
            self._follow(now, deliver)
            return
        watched = [p for rank, p in now.items() if rank not in self.finished]
        suspected = job_hung(self.setting, watched, self.pg_timeout_s)
        if not suspected:
            return
        proven = job_hung(self.setting, [readings[p.rank].progress for p in watched], self.pg_timeout_s)
        # Readings taken before the last hang ended are that hang's: they prove no new one.
        old = [p for p in proven if self.clock() - readings[p.rank].read_age_s < self.closed_at]
        if not proven or old:  # the readings are too old to say: read those nodes again, now
            stale = {readings[p.rank].node for p in (old or suspected) if readings[p.rank].read_age_s > 0}
            self.refreshes.ask(pool, sorted(stale), self.clock())
            return
        key = suspicion_key(proven)
        if not self.rounds.due(self.setting, key, self.clock()):
            return
        before = {p.rank: counts_of(p) for p in watched}
        round_ = EvidenceRound(
            self.setting, self.on_hang, self.pg_timeout_s, self.episode + 1, self.checkpoint_reports, self.restarted
        )
        with gc_paused():  # the evidence is freed inside it, when the round returns
            ranks = {p.rank: (p, readings[p.rank].node) for p in watched}
            hang = round_.run(target, pool, ranks, before, ask or self.ask or ask_loggers)
        self.judged = round_.judged  # the processes judged: what an end may end
        if hang is None:  # progress since the suspicion, or nothing fresh to prove it: not a word
            self.rounds.missed(key, self.clock())
            return
        self.rounds.confirmed()
        self._raise(target, pool, hang, warner, deliver)

    def _raise(
        self,
        target: WatchedRun,
        pool: LoggerPool,
        hang: Judged,
        warner: Warner,
        deliver: Callable[[HangNotice], None],
    ) -> None:
        self.episode += 1
        self.open, self.counts, self.stopped, self.raised_at = True, hang.counts, hang.notice.stopped, self.clock()
        if target.attempt is not None:
            self.views.keep(target.attempt, hang.notice)
            self.viewed = target.attempt
        warner.warn(f"hang:{target.run_id}:{self.episode}", f"training hangs: {hang.sentence}")
        deliver(hang.notice)
        self.ended = self.on_hang.ends_attempt and hang.repeat_of is None
        if self.ended:
            if hang.place is not None:
                self.restarted[hang.place] = self.episode
            why = f"hang {self.episode} (ray_wandb_nodes on_hang='restart'): {hang.sentence}"
            self.end_attempt(target, pool, hang.notice.stopped or tuple(sorted(self.counts)), why, warner)

    def _follow(self, now: Mapping[int, RankProgress], deliver: Callable[[HangNotice], None]) -> None:
        """A hang is open: its end when a rank moves or finishes; a new attempt closes it without a word."""
        if any(rank in self.counts and p.pid != self.counts[rank][0] for rank, p in now.items()):
            self.open, self.closed_at = False, self.clock()  # a new attempt (a restart): its hangs are new ones
            return
        if self.ended:
            # The attempt was ended: a waiter let go of Ray's barrier as its peer failed is no
            # progress, and the next attempt's ranks are new processes.
            return
        moved, finished = self._moved(now)
        if moved or finished:
            self.open, self.closed_at = False, self.clock()
            self.views.drop(self.viewed)  # progress again: a later failure is not this hang's
            deliver(resumed_notice(self.episode, moved, self.clock() - self.raised_at, finished))

    def _moved(self, now: Mapping[int, RankProgress]) -> tuple[list[int], list[int]]:
        """The ranks that moved since the hang, and those that finished training."""
        finished = sorted(rank for rank in self.finished if rank in self.counts)
        moved = [
            rank for rank, p in sorted(now.items())
            if rank in self.counts and rank not in self.finished and counts_of(p) != self.counts[rank]
        ]  # fmt: skip
        return moved, finished

    def close(self, target: WatchedRun, pool: LoggerPool, deliver: Callable[[HangNotice], None]) -> None:
        """The run ends: a hang still open gets its closing notice before the run's primary
        finishes (progress again where a rank moved or finished, else the run ended with it); one
        whose attempt the watch ended (``on_hang="restart"``) closed with that attempt."""
        if not self.open:
            return
        self.open = False
        if self.ended:
            return
        readings = self.progress(target, pool)
        now = {rank: reading.now() for rank, reading in readings.items()}
        if any(rank in self.counts and p.pid != self.counts[rank][0] for rank, p in now.items()):
            return  # a new attempt closed it (see _follow)
        moved, finished = self._moved(now)
        after = self.clock() - self.raised_at
        if moved or finished:
            deliver(resumed_notice(self.episode, moved, after, finished))
        else:
            deliver(ended_notice(self.episode, self.stopped or tuple(sorted(self.counts)), after))

    def progress(self, target: WatchedRun, pool: LoggerPool) -> dict[int, Reading]:
        """The run's ranks as last read (rank -> its reading), placed ranks of its current attempt
        only (their folder: ``target.attempt``; none before its ranks are armed)."""
        return read_progress(self._placed(target), target, pool, self.clock)

    def _placed(self, target: WatchedRun) -> dict[str, tuple[int, ...]]:
        return self.ranks if self.ranks is not None else target.ranks

    def end_attempt(
        self, target: WatchedRun, pool: LoggerPool, ranks: tuple[int, ...], why: str, warner: Warner
    ) -> None:
        """``on_hang="restart"``: end the stopped ranks (``why`` is the error they raise), so that
        Ray Train's failure handling restarts the attempt from its last checkpoint (or ends the run):
        each rank's process as it was judged, and no other (``hang_ends.py``)."""
        if not end_hung_ranks(target, pool, self._placed(target), self.judged, ranks, why, warner):
            return  # no ranks armed, none judged (progress() found none)
        warner.warn(
            f"hang-restart:{target.run_id}:{self.episode}",
            f"hang {self.episode}: ended rank(s) {', '.join(map(str, ranks))} (on_hang='restart'); Ray Train's "
            "FailureConfig decides whether the attempt restarts from its last checkpoint",
        )
