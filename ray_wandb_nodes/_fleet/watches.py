"""Which attempt folders each node logger watches, kept in step with the runs' placements (on the
fleet thread).

A shared run whose ranks record their failures (and, with hang detection, stamp their beacons) has
the key of its ranks' current attempt (their folder on each node) and its ranks on each node. The
logger of each such node watches that folder for those ranks, whatever writer it hosts for the run:
a member's, an observer's past the writer cap, one that failed to join, or none yet. Watching ranks
is apart from hosting writers, so a writer's end (a straggler's node promoted from observer to
member) never ends its ranks' watch. The fleet's own node (a run's ``covered_node``) is read by the
fleet itself, here too. A folder no run wants on a node any more (the attempt restarted, the run
ended, its ranks moved) is let go there: removed once no process of it lives. The work is done on
change only: a placement, an attempt, a logger started, dropped or restarted (each of which
re-plans the fleet).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._failure import SETTLE_S, NodeDeaths, NodeFacts
from .._hang import remove_dead, remove_if_dead, run_dir, touch
from .._warn import Warner, describe
from .node_console import last_words
from .pool import LoggerPool
from .targets import RunTarget, SharedTarget

Watches = dict[str, dict[str, tuple[int, ...]]]  # node id -> attempt key -> the ranks there
LEASE_EVERY_S = 30.0  # the fleet's own node: its folders' lease and dead processes, this often
RETIRE_S = 60.0  # an attempt folder of the fleet's own node waits this long for its last processes
LOOK_EVERY_S = 0.5  # the fleet's own node: its ranks' processes and records, at most this often


def placed_ranks(target: RunTarget) -> Mapping[str, tuple[int, ...]]:
    """The ranks on each node that ``target`` watches: a Train run's inside a Tune trial (as it
    published them), else the run's placement."""
    relayed = target.relayed_ranks if isinstance(target, SharedTarget) else None
    return relayed if relayed is not None else target.ranks


def wanted_watches(targets: Iterable[RunTarget]) -> tuple[Watches, dict[str, tuple[int, ...]]]:
    """What the runs want watched (pure): on each node with a logger, each attempt key and its
    ranks there; and on the fleet's own node (a run's ``covered_node``), each key and its ranks.
    Only a shared run with an attempt (its ranks set up to record) wants anything."""
    remote: Watches = {}
    local: dict[str, tuple[int, ...]] = {}
    for target in targets:
        if not isinstance(target, SharedTarget) or target.attempt is None:
            continue
        for node_id, ranks in placed_ranks(target).items():
            if not ranks:
                continue
            if node_id == target.covered_node:
                local[target.attempt] = tuple(sorted(set(local.get(target.attempt, ())) | set(ranks)))
            else:
                remote.setdefault(node_id, {})[target.attempt] = tuple(sorted(ranks))
    return remote, local


class FleetWatches:
    """The fleet's side of the node loggers' watches, and the watch of the fleet's own node."""

    def __init__(self, warner: Warner, clock: Callable[[], float] = time.monotonic) -> None:
        self._warner = warner
        self._clock = clock
        self._seen: Any = None  # what the last sync read: nothing changed, nothing to do
        self._local: dict[str, tuple[int, ...]] = {}  # attempt keys of the fleet's own node -> its ranks
        self._retiring: dict[str, float] = {}  # the fleet's own node: key -> until when it is retried
        self._leased = float("-inf")
        self.deaths = NodeDeaths(last_words=last_words)  # the fleet's own node's ranks' ends (_failure.deaths)
        self._looked = float("-inf")

    def local_facts(self, primary: Any) -> Callable[[str, Sequence[int]], NodeFacts]:
        """What the fleet's own node tells of an attempt's ranks (its memory: ``primary``'s samples)."""

        def facts(key: str, ranks: Sequence[int]) -> NodeFacts:
            summary = getattr(primary, "summary", None)
            return self.deaths.facts(key, ranks, getattr(summary, "mem", None), settle_s=SETTLE_S)

        return facts

    def sync(self, targets: Mapping[str, RunTarget], pool: LoggerPool, replanned: bool) -> None:
        """Ask each logger to watch what the runs want on its node and to let go of the rest; on a
        change of the runs' placements or attempts, or after a plan (``replanned``: loggers
        started, dropped or restarted)."""
        shape = [(t.run_id, t.attempt, placed_ranks(t)) for t in targets.values()]
        if replanned or shape != self._seen:
            self._seen = shape
            remote, local = wanted_watches(targets.values())
            for handle in pool.handles():
                self._send(handle, remote.get(handle.node.node_id, {}))
            for key in self._local.keys() - local.keys():
                self._retiring[key] = self._clock() + RETIRE_S
            for key in local:
                self._retiring.pop(key, None)
            self._local, self._leased = local, float("-inf")
        self._keep_local()

    def _send(self, handle: Any, wanted: dict[str, tuple[int, ...]]) -> None:
        try:
            for key, ranks in wanted.items():
                if handle.watching.get(key) != ranks:
                    handle.actor.watch.remote(key, ranks)
            for key in handle.watching.keys() - wanted.keys():
                handle.actor.unwatch.remote(key)
        except Exception as e:  # noqa: BLE001 - a logger that is gone: its replacement is asked afresh
            self._warner.warn(f"watch:{handle.node.node_id}", f"could not update the hang watch on {handle.node.label} "
                              f"({describe(e)})")  # fmt: skip
            return
        handle.watching = dict(wanted)

    def _keep_local(self) -> None:
        """The fleet's own node: its watched folders' lease and dead processes (every
        ``LEASE_EVERY_S``), and the folders of attempts that are over, removed once dead."""
        now = self._clock()
        if now - self._looked >= LOOK_EVERY_S:  # before any removal: a dead rank's record is kept
            self._looked = now
            self.deaths.look(self._local)
        for key, until in list(self._retiring.items()):
            if remove_if_dead(run_dir(key)) or now >= until:
                del self._retiring[key]  # one still live past it is the janitor's
        if self._local and now - self._leased >= LEASE_EVERY_S:
            self._leased = now
            for key, ranks in self._local.items():
                touch(run_dir(key))
                remove_dead(run_dir(key), ranks, self.deaths.ended(key))  # only ends already read

    def close(self) -> None:
        """The fleet ends: its own node's folders go now where nothing of them lives."""
        for key in [*self._local, *self._retiring]:
            remove_if_dead(run_dir(key))
        self._local, self._retiring = {}, {}
