"""A node's watch on its ranks' ends, by attempt folder, as its watcher runs it (a node's logger;
for the ranks on the controller's own node, the fleet thread).

The watcher feeds it, on each of its looks, the attempt folders it watches and their ranks on this
node. Each rank's process is found by its files in the folder (its mark, written at set-up with or
without hang detection, its beacon's slot, its record) and looked at (:class:`DeathWatch`: when it
was last seen alive, when first found gone, the cgroup's OOM kills between), and each new record
of a rank's end is read once and kept. Kept, because a folder's files go with their process
(``_hang.remove_dead``): a rank that raised is stopped by Ray moments later, and its record must
outlive it until the driver side asks. The watcher looks here before it removes anything.

It keeps, too, each rank's last progress read off its beacon (its counts, and how long ago it
moved), so that the rank the others waited for is seen after its files went; and a dead rank's last
words (the tail of its worker's log, the caller's ``last_words``: what NCCL's watchdog or a
crash printed before the process ended), read once, as it is found gone without a record.

An attempt no longer watched (the next one started, the run ended) is kept ``KEEP_S`` more, since
its facts may be asked after the watch moved on, then forgotten.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._hang import RankProgress, progress_of, rank_processes, read_slots, run_dir
from .last_words import LastWords, read_last_words
from .node import DeathWatch, NodeFacts, OomCounter, RankMemory
from .record import RankRecord, RecordKind, new_records

KEEP_S = 120.0  # an attempt's facts, after its watch ended (the driver side asks within seconds)
# How long a failed attempt's facts wait for every rank's end: Ray Train asks its live workers to
# stop right after its decision (every one at once) and kills them 5 s later; well inside the
# fleet's FACTS_TIMEOUT_S (5 s), so that an answer still comes in time.
SETTLE_S, SETTLE_POLL_S = 3.0, 0.05


@dataclass
class _Attempt:
    deaths: DeathWatch
    ranks: frozenset[int] = frozenset()
    processes: set[tuple[int, int]] = field(default_factory=set)  # (rank, pid): every one seen, dead ones too
    records: list[RankRecord] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # the record files read
    progress: dict[int, tuple[RankProgress, int]] = field(default_factory=dict)  # rank -> last reading, its ns
    last_words: dict[tuple[int, int], LastWords] = field(default_factory=dict)  # (rank, pid) -> what its log said


class NodeDeaths:
    """The ends of the ranks one watcher watches, by attempt key. Its looks and its answers may
    come on two threads (a node logger's status runs on its control thread and after a writer's
    finish): one lock, held for this node's file reads only."""

    def __init__(
        self,
        root: Path | None = None,
        read_oom_kills: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        last_words: Callable[[int], str] | None = None,
    ) -> None:
        self._root = root
        self._last_words = last_words  # pid -> the tail of its worker's log ("" where none)
        self._read = read_oom_kills or OomCounter()
        self._clock = clock
        self._lock = threading.Lock()
        self._attempts: dict[str, _Attempt] = {}
        self._left: dict[str, float] = {}  # key -> when its watch ended

    def look(self, watching: Mapping[str, Collection[int]]) -> None:
        """Look at the ranks of every attempt in ``watching`` (key -> its ranks on this node)."""
        with self._lock:
            now = self._clock()
            for key, ranks in watching.items():
                self._look(key, frozenset(ranks))
                self._left.pop(key, None)
            for key in self._attempts.keys() - watching.keys():
                self._left.setdefault(key, now)
            for key, since in list(self._left.items()):
                if now - since >= KEEP_S:
                    self._attempts.pop(key, None)
                    del self._left[key]

    def facts(
        self, key: str, ranks: Collection[int], memory_percent: float | None = None, settle_s: float = 0.0
    ) -> NodeFacts:
        """What this node tells of ``ranks`` of the attempt ``key`` now, after a last look; with
        ``settle_s``, once every rank has an end to tell (gone, or a record: Ray Train asks each
        live worker to stop right after its decision, and the record of that stop says where the
        rank stood) or ``settle_s`` passed."""
        wanted = frozenset(ranks)
        deadline = time.monotonic() + settle_s
        while settle_s > 0 and time.monotonic() < deadline and not self._settled(key, wanted):
            time.sleep(SETTLE_POLL_S)
        with self._lock:
            held = self._attempts.get(key)
            attempt = self._look(key, wanted | (held.ranks if held is not None else frozenset()))
            now = time.monotonic_ns()
            progress = tuple(
                replace(p, age_s=p.age_s + (now - at) / 1e9) for rank, (p, at) in sorted(attempt.progress.items())
                if rank in wanted
            )  # fmt: skip
            return NodeFacts(
                tuple(r for r in attempt.records if r.rank in wanted),
                tuple(g for g in attempt.deaths.gone() if g.rank in wanted),
                attempt.deaths.oom_kills_since_start(),
                memory_percent,
                progress=progress,
                last_words=tuple((r, p, t) for (r, p), t in sorted(attempt.last_words.items()) if r in wanted),
                ranks_memory=tuple(m for m in attempt.deaths.memory() if m.rank in wanted),
            )

    def _settled(self, key: str, ranks: frozenset[int]) -> bool:
        with self._lock:
            held = self._attempts.get(key)
            attempt = self._look(key, ranks | (held.ranks if held is not None else frozenset()))
            told = {r.rank for r in attempt.records} | {g.rank for g in attempt.deaths.gone()}
            return ranks <= told

    def memory(self, key: str) -> tuple[RankMemory, ...]:
        """The attempt ``key``'s ranks' memory as sampled on the looks so far (no look now)."""
        with self._lock:
            held = self._attempts.get(key)
            return tuple(held.deaths.memory()) if held is not None else ()

    def ended(self, key: str) -> set[tuple[int, int]]:
        """The ``(rank, pid)`` of the attempt ``key`` found gone, their records read: whose files
        may go now (``_hang.remove_dead``'s ``only``)."""
        with self._lock:
            held = self._attempts.get(key)
            return {(g.rank, g.pid) for g in held.deaths.gone()} if held is not None else set()

    def keys(self) -> set[str]:
        with self._lock:
            return set(self._attempts)

    def _look(self, key: str, ranks: frozenset[int]) -> _Attempt:
        attempt = self._attempts.get(key)
        if attempt is None:
            attempt = self._attempts[key] = _Attempt(DeathWatch(self._read))  # its OOM baseline: now
        attempt.ranks = ranks
        folder = run_dir(key, self._root)
        attempt.processes |= {p for p in rank_processes(folder) if p[0] in ranks}
        now = time.monotonic_ns()
        for slot in read_slots(folder):
            if slot.rank in ranks:
                attempt.progress[slot.rank] = (progress_of(slot, now), now)
        # Every process seen, its files gone or not: one that died since the last look is found gone.
        gone = attempt.deaths.look(sorted(attempt.processes))
        attempt.records += [r for r in new_records(folder, attempt.seen) if r.rank in ranks]
        raised = {(r.rank, r.pid) for r in attempt.records if r.kind is RecordKind.RAISED}
        for g in gone:
            if self._last_words is not None and (g.rank, g.pid) not in raised:
                said = read_last_words(self._last_words(g.pid))  # read here: a few lines cross, never the tail
                if said.found:
                    attempt.last_words[(g.rank, g.pid)] = said
        return attempt
