"""A run's ranks' progress as the fleet last read it, for its hang watch (``hangs.py``): off each
node logger's last ping (as old as that ping), and off the beacons of the controller's own node
(read now)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from .._hang import RankProgress, progress_of, read_slots, run_dir

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun


class Reading(NamedTuple):
    """One rank's progress as its node last read it, the node, and how long ago that was (a
    ping's readings are as old as the ping; the controller's own node is read now)."""

    progress: RankProgress
    node: str
    read_age_s: float = 0.0

    def now(self) -> RankProgress:
        """The reading aged to now: what it says if the rank has not moved since."""
        return aged((self.progress,), self.read_age_s)[0]


def read_progress(
    placed: Mapping[str, tuple[int, ...]], target: WatchedRun, pool: LoggerPool, clock: Callable[[], float]
) -> dict[int, Reading]:
    """The run's ranks as last read (rank -> its reading), those ``placed`` on each node (node id
    -> ranks) of its current attempt only (their folder: ``target.attempt``; none before its ranks
    are armed). ``clock``: the pool's (a handle's ``progress_at`` is on it)."""
    out: dict[int, Reading] = {}
    key = target.attempt
    if key is None:
        return out
    for node_id, ranks in placed.items():
        read_age_s = 0.0
        if node_id == target.covered_node:
            now = time.monotonic_ns()
            seen: tuple[RankProgress, ...] = tuple(progress_of(s, now) for s in read_slots(run_dir(key)))
        else:
            handle = pool.get(node_id)
            seen = handle.progress.get(key, ()) if handle else ()
            read_age_s = clock() - handle.progress_at if handle else 0.0
        for progress in seen:
            if progress.rank in ranks:
                out[progress.rank] = Reading(progress, node_id, max(0.0, read_age_s))
    return out


def node_ages(readings: Mapping[int, Reading], now: Mapping[int, RankProgress]) -> dict[str, float]:
    """Each node's last progress (the age of its ranks' oldest, aged to ``now``): the nodes table's."""
    ages: dict[str, float] = {}
    for rank, p in now.items():
        ages[readings[rank].node] = max(ages.get(readings[rank].node, 0.0), p.age_s)
    return ages


def aged(ranks: tuple[RankProgress, ...], since_s: float) -> tuple[RankProgress, ...]:
    """``ranks`` as read ``since_s`` ago, aged by that much (a ping's ages are as old as the ping)."""
    if since_s <= 0:
        return ranks
    return tuple(replace(r, age_s=r.age_s + since_s, phase_age_s=r.phase_age_s + since_s) for r in ranks)
