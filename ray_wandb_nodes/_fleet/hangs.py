"""The fleet's side of hang detection: one run's ranks' progress (as the node loggers' pings bring
it, and off the beacons of the controller's own node), the policy applied, every rank's evidence
taken at once when fresh readings prove one past its limit (``_hang/confirm.py``), the verdict
handed to the run's primary, and the end of the episode when progress resumes or the run ends.
Runs on the fleet thread, after each health check."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from .._config.values import OnHang
from .._failure import HangView
from .._hang import (
    Counts,
    EndAnswer,
    HangNotice,
    HangTimeout,
    Place,
    RankProcess,
    RankProgress,
    Rounds,
    counts_of,
    describe_place,
    end_ranks,
    ended_notice,
    hang_notice,
    job_hung,
    judge,
    place_of,
    progress_of,
    read_slots,
    resumed_notice,
    run_dir,
    still_hung,
    suspicion_key,
)
from .._warn import Warner, describe
from .hang_nodes import Ask, Refreshes, ask_loggers, evidence

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun

VIEWS_KEPT = 8  # attempts whose last hang's judgement is kept for their failure
END_TIMEOUT_S = 10.0  # every node's answer to an end (a control call: answered while its writers are busy)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic collector held off while a hang's evidence is unpickled, judged and
    written: 1,000 nodes' answers are millions of new objects, and each full collection they
    set off walks the whole heap (check() to the notice at 8,000 ranks: 3.1 s with it, 0.6 s
    without; ``bench/hang_evidence.py``). The evidence is freed (by reference counts) before
    the collector is back, so that its first collection does not walk it either."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def poll_s(setting: HangTimeout, default_s: float) -> float:
    """The fleet's poll (and each logger's ping) for a run with ``setting``: a short fixed
    ``hang_timeout_s`` is seen within a sixteenth of it, at most every quarter second."""
    if setting.seconds is None:
        return default_s
    return min(default_s, max(0.25, setting.seconds / 16))


class Reading(NamedTuple):
    """One rank's progress as its node last read it, the node, and how long ago that was (a
    ping's readings are as old as the ping; the controller's own node is read now)."""

    progress: RankProgress
    node: str
    read_age_s: float = 0.0

    def now(self) -> RankProgress:
        """The reading aged to now: what it says if the rank has not moved since."""
        return aged((self.progress,), self.read_age_s)[0]


class Judged(NamedTuple):
    """An evidence round that confirmed its suspicion: the hang's notice and what the watch keeps."""

    notice: HangNotice
    sentence: str
    counts: dict[int, Counts]
    place: Place | None
    repeat_of: int | None  # the hang that ended the attempt before at the same place


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
    views: dict[str, HangView] = field(default_factory=dict)
    viewed: str = ""  # the attempt whose view the open hang set (dropped when progress resumes)

    def view(self, key: str | None) -> HangView | None:
        """What the last hang of the attempt ``key`` said of who stopped and who waits (None: none)."""
        return self.views.get(key) if key is not None else None

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
            ages: dict[str, float] = {}
            for rank, p in now.items():
                ages[readings[rank].node] = max(ages.get(readings[rank].node, 0.0), p.age_s)
            target.health.progress(ages)
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
        with gc_paused():  # the evidence is freed inside it, when _judge returns
            hang = self._judge(target, pool, {p.rank: (p, readings[p.rank].node) for p in watched}, before, ask)
        if hang is None:  # progress since the suspicion, or nothing fresh to prove it: not a word
            self.rounds.missed(key, self.clock())
            return
        self.rounds.confirmed()
        self._raise(target, pool, hang, warner, deliver)

    def _judge(
        self,
        target: WatchedRun,
        pool: LoggerPool,
        ranks: Mapping[int, tuple[RankProgress, str]],
        before: Mapping[int, Counts],
        ask: Ask | None,
    ) -> Judged | None:
        """The evidence round: every rank read again with its evidence; the hang's notice when the
        fresh readings still show no progress past the limit, else None (the evidence dropped on return)."""
        started = time.monotonic()
        facts = evidence(target, pool, ranks, ask or self.ask or ask_loggers)
        # The processes judged: what an end may end (the fresh reading where a node answered).
        self.judged = {f.progress.rank: f.progress for f in facts}
        fresh = [f.progress for f in facts if f.evidence is not None]
        unanswered = [f.progress for f in facts if f.evidence is None]
        if not still_hung(self.setting, fresh, unanswered, before, self.pg_timeout_s):
            return None
        silent = sorted({f.node for f in facts if f.evidence is None})
        taken = f"Evidence: {len(facts)} ranks, asked at once, in {time.monotonic() - started:.1f} s" + (
            f"; no answer from {', '.join(silent)}." if silent else "."
        )
        verdict = judge(facts)
        place = place_of(verdict, self.checkpoint_reports)
        repeat_of = self.restarted.get(place) if self.on_hang.ends_attempt and place is not None else None
        repeat = ""
        if repeat_of is not None and place is not None:
            repeat = (
                f"The attempt before this one stopped at the same place in hang {repeat_of}, which ended it: "
                f"{describe_place(place)}. This attempt is not ended: on_hang='restart' ends one attempt a place."
            )
        notice = hang_notice(verdict, facts, self.episode + 1, self.on_hang, taken=taken, repeat=repeat)
        counts = {f.progress.rank: counts_of(f.progress) for f in facts}
        return Judged(notice, verdict.sentence, counts, place, repeat_of)

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
            self.views[target.attempt], self.viewed = hang_view(hang.notice), target.attempt
            while len(self.views) > VIEWS_KEPT:
                self.views.pop(next(iter(self.views)))
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
            self.views.pop(self.viewed, None)  # progress again: a later failure is not this hang's
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
        out: dict[int, Reading] = {}
        key = target.attempt
        if key is None:
            return out
        for node_id, ranks in (self.ranks if self.ranks is not None else target.ranks).items():
            read_age_s = 0.0
            if node_id == target.covered_node:
                now = time.monotonic_ns()
                seen: tuple[RankProgress, ...] = tuple(progress_of(s, now) for s in read_slots(run_dir(key)))
            else:
                handle = pool.get(node_id)
                seen = handle.progress.get(key, ()) if handle else ()
                read_age_s = self.clock() - handle.progress_at if handle else 0.0
            for progress in seen:
                if progress.rank in ranks:
                    out[progress.rank] = Reading(progress, node_id, max(0.0, read_age_s))
        return out

    def end_attempt(
        self, target: WatchedRun, pool: LoggerPool, ranks: tuple[int, ...], why: str, warner: Warner
    ) -> None:
        """``on_hang="restart"``: end the stopped ranks (``why`` is the error they raise), so that
        Ray Train's failure handling restarts the attempt from its last checkpoint (or ends the run).

        Each node is told the attempt (its folder) and each rank's process as it was judged (pid
        and start time): it ends those and refuses anything else, so an end that arrives late
        (past ``END_TIMEOUT_S``, when this stops waiting) never ends a later attempt's ranks or
        another job's. Every node is asked at once."""
        key = target.attempt
        if key is None:  # no ranks armed, none judged (progress() found none)
            return
        named: dict[str, list[RankProcess]] = {}
        for node_id, placed in (self.ranks if self.ranks is not None else target.ranks).items():
            mine = [self.judged[r] for r in placed if r in ranks and r in self.judged]
            if mine:
                named[node_id] = [RankProcess(p.rank, p.pid, p.proc_start) for p in mine]
        pending: dict[Any, tuple[str, list[RankProcess]]] = {}
        for node_id, processes in named.items():
            try:
                if node_id == target.covered_node:
                    _refused(end_ranks(key, processes, why), node_id, warner)
                elif (handle := pool.get(node_id)) is not None:
                    pending[handle.actor.end_ranks.remote(key, processes, why)] = (node_id, processes)
            except Exception as e:  # noqa: BLE001
                warner.warn(f"hang-end:{node_id}", f"could not end the hung ranks {_ranks(processes)} ({describe(e)})")
        _await_ends(pending, warner)
        warner.warn(
            f"hang-restart:{target.run_id}:{self.episode}",
            f"hang {self.episode}: ended rank(s) {', '.join(map(str, ranks))} (on_hang='restart'); Ray Train's "
            "FailureConfig decides whether the attempt restarts from its last checkpoint",
        )


def _ranks(processes: list[RankProcess]) -> str:
    return ", ".join(str(p.rank) for p in processes)


def _refused(answer: EndAnswer, node_id: str, warner: Warner) -> None:
    if answer.refused:
        warner.warn(
            f"hang-end-refused:{node_id}:{answer.refused}",
            f"hung rank(s) {', '.join(map(str, answer.refused))} were not ended: their process is no longer "
            "the one judged (it ended, or the attempt did)",
        )


def _await_ends(pending: dict[Any, tuple[str, list[RankProcess]]], warner: Warner) -> None:
    """Every node's answer to its end, waited for together (bounded: ``END_TIMEOUT_S``)."""
    if not pending:
        return
    import ray

    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=END_TIMEOUT_S)
    for ref, (node_id, processes) in pending.items():
        try:
            if ref not in ready:
                raise TimeoutError(f"no answer in {END_TIMEOUT_S:.0f} s")
            _refused(ray.get(ref), node_id, warner)
        except Exception as e:  # noqa: BLE001
            warner.warn(f"hang-end:{node_id}", f"could not end the hung ranks {_ranks(processes)} ({describe(e)})")


def hang_view(notice: HangNotice) -> HangView:
    """A hang's judgement as the failure rule takes it: who stopped, where, and who waits in which collective."""
    rows = {r.rank: r for r in notice.rows}
    waits = [r for r in notice.rows if r.state == "waits" and r.collective and r.collective != "report"]
    first = waits[0] if waits else None
    return HangView(
        stopped=notice.stopped,
        where={rank: r.where for rank, r in rows.items() if rank in notice.stopped and r.where},
        steps={rank: r.last_step for rank, r in rows.items()},
        collective=first.collective if first else "",
        seq=first.seq if first else None,
        group=first.group if first else "",
        episode=notice.episode,
    )


def aged(ranks: tuple[RankProgress, ...], since_s: float) -> tuple[RankProgress, ...]:
    """``ranks`` as read ``since_s`` ago, aged by that much (a ping's ages are as old as the ping)."""
    if since_s <= 0:
        return ranks
    return tuple(replace(r, age_s=r.age_s + since_s, phase_age_s=r.phase_age_s + since_s) for r in ranks)
