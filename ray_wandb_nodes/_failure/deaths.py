"""A node's watch on its ranks' ends, by attempt folder, as its watcher runs it (a node's logger;
for the ranks on the controller's own node, the fleet thread).

The watcher feeds it, on each of its looks, the attempt folders it watches and their ranks on this
node. Each rank's process is found by its files in the folder (its mark, written at set-up with or
without hang detection, its beacon's slot, its record) and looked at (:class:`DeathWatch`: when it
was last seen alive, when first found gone, the cgroup's OOM kills between), and each new record
of a rank's end is read once and kept. Kept, because a folder's files go with their process
(``_hang.remove_dead``): a rank that raised is stopped by Ray moments later, and its record must
outlive it until the driver side asks. The watcher looks here before it removes anything.

An attempt no longer watched (the next one started, the run ended) is kept ``KEEP_S`` more, since
its facts may be asked after the watch moved on, then forgotten.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._hang import rank_processes, run_dir
from .node import DeathWatch, NodeFacts, OomCounter
from .record import RankRecord, new_records

KEEP_S = 120.0  # an attempt's facts, after its watch ended (the driver side asks within seconds)


@dataclass
class _Attempt:
    deaths: DeathWatch
    ranks: frozenset[int] = frozenset()
    processes: set[tuple[int, int]] = field(default_factory=set)  # (rank, pid): every one seen, dead ones too
    records: list[RankRecord] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)  # the record files read


class NodeDeaths:
    """The ends of the ranks one watcher watches, by attempt key. Its looks and its answers may
    come on two threads (a node logger's status runs on its control thread and after a writer's
    finish): one lock, held for this node's file reads only."""

    def __init__(
        self,
        root: Path | None = None,
        read_oom_kills: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = root
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

    def facts(self, key: str, ranks: Collection[int], memory_percent: float | None = None) -> NodeFacts:
        """What this node tells of ``ranks`` of the attempt ``key`` now, after a last look."""
        wanted = frozenset(ranks)
        with self._lock:
            held = self._attempts.get(key)
            attempt = self._look(key, wanted | (held.ranks if held is not None else frozenset()))
            return NodeFacts(
                tuple(r for r in attempt.records if r.rank in wanted),
                tuple(g for g in attempt.deaths.gone() if g.rank in wanted),
                attempt.deaths.oom_kills_since_start(),
                memory_percent,
            )

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
        # Every process seen, its files gone or not: one that died since the last look is found gone.
        attempt.deaths.look(sorted(attempt.processes))
        attempt.records += [r for r in new_records(folder, attempt.seen) if r.rank in ranks]
        return attempt
