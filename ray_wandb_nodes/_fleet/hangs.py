"""The fleet's side of hang detection: one run's ranks' progress (as the node loggers' pings bring
it, and off the beacons of the controller's own node), the policy applied, every rank's evidence
taken at once when one is past its limit, the verdict handed to the run's primary, and the end of
the episode when progress resumes. Runs on the fleet thread, after each health check."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._gpu_ids import named
from .._hang import (
    DUMPS_TIMEOUT_S,
    PYSPY_TIMEOUT_S,
    EndAnswer,
    HangNotice,
    HangTimeout,
    RankEvidence,
    RankFacts,
    RankProcess,
    RankProgress,
    end_ranks,
    hang_notice,
    job_hung,
    judge,
    progress_of,
    rank_evidence,
    read_slots,
    resumed_notice,
    run_dir,
)
from .._warn import Warner, describe

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .targets import SharedTarget

# Every node's answer, waited for together: each node bounds its own dumps (``DUMPS_TIMEOUT_S``);
# past this, a node that has not answered is named in verdict.txt and its ranks are judged from
# their progress alone, so that one stuck logger does not hold the whole hang's alert.
EVIDENCE_TIMEOUT_S = DUMPS_TIMEOUT_S + PYSPY_TIMEOUT_S + 5.0
END_TIMEOUT_S = 10.0  # every node's answer to an end (a control call: answered while its writers are busy)

Evidence = tuple[tuple[RankProgress, RankEvidence], ...]


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


@dataclass
class HangWatch:
    """One run's hang detection. ``setting`` is its ``hang_timeout_s``; ``pg_timeout_s`` torch's
    process-group timeout (every limit stays below it, so the evidence is taken while the
    processes live)."""

    setting: HangTimeout
    on_hang: str = "alert"
    pg_timeout_s: float | None = None
    episode: int = 0  # hangs raised so far
    open: bool = False  # a hang raised and no progress since
    counts: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank -> (pid, reports, steps) at the hang
    raised_at: float = 0.0
    # The ranks on each node where the run's own placement does not say (a Train run inside a
    # Tune trial publishes them); None: the run's (``target.ranks``).
    ranks: dict[str, tuple[int, ...]] | None = None
    clock: Callable[[], float] = time.monotonic  # the pool's (a handle's ``progress_at`` is on it)
    # Ranks whose train function returned (Train's poll status, from the controller): silent, not hung.
    finished: frozenset[int] = frozenset()
    # Each rank's process as the last evidence round read it: an end names these, and no other.
    judged: dict[int, RankProgress] = field(default_factory=dict)

    def check(
        self,
        target: SharedTarget,
        pool: LoggerPool,
        warner: Warner,
        deliver: Callable[[HangNotice], None],
        ask: Callable[[list[Any], str, list[list[int]]], list[Evidence | None]] | None = None,
    ) -> None:
        """Judge the run's ranks now; raise a hang (or its end) through ``deliver``."""
        ranks = self.progress(target, pool)
        if not ranks:
            return
        if target.health is not None:  # the nodes table's last progress of each node
            ages: dict[str, float] = {}
            for r, node in ranks.values():
                ages[node] = max(ages.get(node, 0.0), r.age_s)
            target.health.progress(ages)
        if self.open:
            if any(r.rank in self.counts and r.pid != self.counts[r.rank][0] for r, _ in ranks.values()):
                self.open = False  # a new attempt (a restart): its own hangs are new episodes
                return
            moved = [
                r.rank for r, _ in ranks.values()
                if r.rank in self.counts and (r.reports, r.steps) != self.counts[r.rank][1:]
            ]  # fmt: skip
            if moved and self.on_hang == "restart":
                # The attempt was ended: a waiter let go of Ray's barrier as its peer failed is no
                # progress, and the next attempt's ranks are new processes.
                return
            if moved:
                self.open = False
                deliver(resumed_notice(self.episode, moved, time.monotonic() - self.raised_at))
            return
        if not job_hung(self.setting, [r for r, _ in ranks.values()], self.pg_timeout_s):
            return
        self.episode += 1
        self.open, self.raised_at = True, time.monotonic()
        self.counts = {r.rank: (r.pid, r.reports, r.steps) for r, _ in ranks.values()}
        with gc_paused():  # the evidence is freed inside it, when _notice returns
            notice, sentence = self._notice(target, pool, ranks, ask or _ask_loggers)
        warner.warn(f"hang:{target.run_id}:{self.episode}", f"training hangs: {sentence}")
        deliver(notice)
        if self.on_hang == "restart":
            why = f"hang {self.episode} (ray_wandb_nodes on_hang='restart'): {sentence}"
            self.end_attempt(target, pool, notice.stopped or tuple(sorted(self.counts)), why, warner)

    def _notice(
        self,
        target: SharedTarget,
        pool: LoggerPool,
        ranks: Mapping[int, tuple[RankProgress, str]],
        ask: Callable[[list[Any], str, list[list[int]]], list[Evidence | None]],
    ) -> tuple[HangNotice, str]:
        """The hang's notice and sentence from every rank's evidence (dropped on return)."""
        started = time.monotonic()
        facts = self.evidence(target, pool, ranks, ask)
        silent = sorted({f.node for f in facts if f.evidence is None})
        taken = f"Evidence: {len(facts)} ranks, asked at once, in {time.monotonic() - started:.1f} s" + (
            f"; no answer from {', '.join(silent)}." if silent else "."
        )
        verdict = judge(facts)
        return hang_notice(verdict, facts, self.episode, self.on_hang, taken=taken), verdict.sentence

    def progress(self, target: SharedTarget, pool: LoggerPool) -> dict[int, tuple[RankProgress, str]]:
        """The run's ranks now (rank -> its progress and its node), placed ranks of its current
        attempt only (their folder: ``target.attempt``; none before its ranks are armed)."""
        out: dict[int, tuple[RankProgress, str]] = {}
        key = target.attempt
        if key is None:
            return out
        for node_id, ranks in (self.ranks if self.ranks is not None else target.ranks).items():
            if node_id == target.covered_node:
                now = time.monotonic_ns()
                seen: tuple[RankProgress, ...] = tuple(progress_of(s, now) for s in read_slots(run_dir(key)))
            else:
                handle = pool.get(node_id)
                seen = aged(handle.progress.get(key, ()), self.clock() - handle.progress_at) if handle else ()
            for progress in seen:
                if progress.rank in ranks and progress.rank not in self.finished:
                    out[progress.rank] = (progress, node_id)
        return out

    def evidence(
        self,
        target: SharedTarget,
        pool: LoggerPool,
        ranks: Mapping[int, tuple[RankProgress, str]],
        ask: Callable[[list[Any], str, list[list[int]]], list[Evidence | None]],
    ) -> list[RankFacts]:
        """Every rank's evidence, all nodes asked at once; a rank whose node gave none is judged
        from its progress alone."""
        nodes = sorted({node for _, node in ranks.values()})
        remote = [n for n in nodes if n != target.covered_node and pool.get(n) is not None]
        got: dict[int, tuple[RankProgress, RankEvidence | None]] = {}
        placed: dict[str, list[int]] = {}
        for rank, (_, node) in ranks.items():
            placed.setdefault(node, []).append(rank)
        key = target.attempt or ""  # set: progress() found its ranks
        actors = [pool.get(n).actor for n in remote]  # type: ignore[union-attr]
        answers = ask(actors, key, [sorted(placed[n]) for n in remote]) if remote else []
        if target.covered_node in nodes:
            answers.append(rank_evidence(key, ranks=sorted(placed[target.covered_node])))
        for answer in answers:
            for progress, given in answer or ():
                got[progress.rank] = (progress, given)
        # The processes judged: what an end may end (the fresh reading where a node answered).
        self.judged = {rank: got.get(rank, (progress, None))[0] for rank, (progress, _) in ranks.items()}
        facts = []
        labels = {n: (pool.get(n).node.label if pool.get(n) else "") for n in nodes}  # type: ignore[union-attr]
        if target.covered_node:
            labels[target.covered_node] = target.primary.spec.label
        for rank, (progress, node) in sorted(ranks.items()):
            now_progress, evidence = got.get(rank, (progress, None))
            facts.append(RankFacts(now_progress, evidence, labels.get(node, ""), named(target.rank_gpus.get(rank, ()))))
        return facts

    def end_attempt(
        self, target: SharedTarget, pool: LoggerPool, ranks: tuple[int, ...], why: str, warner: Warner
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


def aged(ranks: tuple[RankProgress, ...], since_s: float) -> tuple[RankProgress, ...]:
    """``ranks`` as read ``since_s`` ago, aged by that much (a ping's ages are as old as the ping)."""
    if since_s <= 0:
        return ranks
    return tuple(replace(r, age_s=r.age_s + since_s, phase_age_s=r.phase_age_s + since_s) for r in ranks)


def _ask_loggers(actors: list[Any], key: str, ranks: list[list[int]]) -> list[Evidence | None]:
    """Every node logger asked for its ranks' evidence (of the attempt ``key``) at once, waited for
    together (bounded)."""
    import ray

    refs = [actor.hang_evidence.remote(key, mine) for actor, mine in zip(actors, ranks, strict=True)]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=EVIDENCE_TIMEOUT_S)
    out: list[Evidence | None] = []
    for ref in refs:
        try:
            out.append(ray.get(ref) if ref in ready else None)
        except Exception:  # noqa: BLE001 - that node's ranks are judged from their progress alone
            out.append(None)
    return out
