"""The logger pool: one ``NodeLogger`` actor per node, and the driver side's handle of each.

It places the actors (a placement group per node: one bundle of a little memory, pinned by the
node's NodeID label, so that a lost node's group goes with it; on Ray 2.50 a group left
rescheduling for a dead node holds back every group created after it, the train workers'
included), starts the janitor that removes those groups should the owner die, adds and finishes
writers, watches their joins, and pings each logger so that one whose process restarted gets
its writers back. It runs on the fleet's
thread only; ``kill_all()`` may be called from elsewhere.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._egress import Egress, WriterEgress
from .._failure import RankMemory
from .._hang import RankProgress
from .._health import NodeSummary, read_warning
from .._steps import RankSteps
from .._wandb.writers import WriterSpec
from .._warn import Warner, describe
from .actors import BUNDLE, PG_NAME_PREFIX, RayActors
from .nodes import NodeInfo
from .plan import run_of
from .wire import ConsoleRanks, LoggerStatus, merged_steps

__all__ = ["BUNDLE", "JOIN_GRACE_S", "PG_NAME_PREFIX", "PING_BATCH", "LoggerHandle", "LoggerPool"]

JOIN_GRACE_S = 60.0  # scheduling and process start, on top of wandb's init timeout
# At most this many new pings a tick, in turn: a 1,000-node fleet pings each logger every ~47 s
# at a 3 s tick, never 1,000 calls a tick.
PING_BATCH = 64


@dataclass
class LoggerHandle:
    """The driver side's handle of one node's ``NodeLogger`` actor."""

    node: NodeInfo
    actor: Any
    pg: Any  # its placement group (one bundle, on its node)
    runs: set[str] = field(default_factory=set)
    ping: Any = None  # an outstanding status() call
    pinged: float = 0.0
    pid: int | None = None  # of the logger's process, to notice a restart
    summary: NodeSummary | None = None  # its node's latest samples, as the last ping brought
    # Each writer's latest samples by run id (a Tune trial's writer samples its own processes).
    summaries: dict[str, NodeSummary] = field(default_factory=dict)
    # The train ranks' progress on its node by attempt key (their beacons), as the last ping brought.
    progress: Mapping[str, tuple[RankProgress, ...]] = field(default_factory=dict)
    progress_at: float = 0.0  # when it came (the pool's clock): its ages are that old
    # The train ranks' step totals on its node by attempt key (their beacons' regions), as the last ping brought.
    steps: Mapping[str, tuple[RankSteps, ...]] = field(default_factory=dict)
    # The train ranks' memory on its node by attempt key, as the last ping brought (a failure's
    # facts where the logger is gone: Ray's memory monitor may kill it with the rank).
    ranks_memory: Mapping[str, tuple[RankMemory, ...]] = field(default_factory=dict)
    warm: bool = False  # started ahead of the train workers' placement, with no writer yet
    ping_runs: frozenset[str] = frozenset()  # its writers joined when the last ping was sent
    # The attempt folders it was asked to watch (key -> the ranks there), as sent (see watches.py).
    watching: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # The ranks whose console it follows for each run (run id ->), as sent (see consoles.py).
    consoles: dict[str, ConsoleRanks] = field(default_factory=dict)


@dataclass
class _Join:
    handle: LoggerHandle
    run_id: str
    ref: Any
    started: float


class _PingTurn:
    """Which loggers are pinged, in turn: at most ``PING_BATCH`` new pings a tick, each logger at
    most every ``ping_s``, in the order they were last pinged; and the pings in flight. The work a
    tick is bounded by the pings in flight, whatever the number of loggers."""

    def __init__(self, ping_s: float) -> None:
        self._ping_s = ping_s
        self._turn: collections.deque[str] = collections.deque()  # nodes in ping order
        self._in_turn: set[str] = set()
        self._in_flight: dict[str, LoggerHandle] = {}  # node -> handle with a ping in flight

    def add(self, node_id: str) -> None:
        if node_id not in self._in_turn:
            self._in_turn.add(node_id)
            self._turn.append(node_id)

    def drop(self, node_id: str) -> None:
        """A logger killed: its ping is not waited for (it leaves the turn when its turn comes)."""
        self._in_flight.pop(node_id, None)

    def answered(self, actors: RayActors) -> list[tuple[LoggerHandle, Any]]:
        """The pings answered since the last call: each logger's handle and its status call's ref."""
        if not self._in_flight:
            return []
        refs = actors.answered([h.ping for h in self._in_flight.values()])
        out = []
        for node_id, handle in list(self._in_flight.items()):
            if handle.ping in refs:
                del self._in_flight[node_id]
                ref, handle.ping = handle.ping, None
                out.append((handle, ref))
        return out

    def send(
        self, handles: Mapping[str, LoggerHandle], now: float, joining: Callable[[LoggerHandle], set[str]]
    ) -> None:
        """The next pings: each due logger with writers and no ping in flight asks its status;
        ``joining``: its writers whose join has not answered (no ping can find them missing)."""
        for _ in range(min(PING_BATCH, len(self._turn))):
            node_id = self._turn[0]
            held = handles.get(node_id)
            if held is None:  # dropped: out of the turn
                self._in_turn.discard(self._turn.popleft())
                continue
            if now - held.pinged < self._ping_s:
                break  # the turn is in ping order: the rest were pinged later
            self._turn.rotate(-1)
            if held.runs and held.ping is None:  # a ping is answered beside the writer calls, a join's first maybe
                held.ping, held.pinged = held.actor.status.remote(), now
                held.ping_runs = frozenset(held.runs - joining(held))
                self._in_flight[node_id] = held


class LoggerPool:
    def __init__(
        self,
        *,
        init_timeout_s: float,
        warner: Warner,
        ping_s: float,
        actors: RayActors | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._init_timeout_s = init_timeout_s
        self._warner = warner
        self._actors = actors or RayActors(warner)
        self._clock = clock
        self._handles: dict[str, LoggerHandle] = {}
        self._joins: list[_Join] = []
        self._group_ids = itertools.count()
        self._lock = threading.Lock()
        self._pings = _PingTurn(ping_s)
        # Nodes whose summary changed since the fleet last took them (see take_updated()).
        self._updated: set[str] = set()
        self.changed = False  # a logger was lost or restarted: the fleet re-plans
        # (node, writer key) of every join that has answered (joined, failed or timed out)
        self.joined: set[tuple[str, str]] = set()
        # What each online writer gets to find its way to W&B (the relay's route, once the run's
        # relay listens); the ways its joins found, until the fleet takes them (take_ways()).
        self.egress = WriterEgress()
        self._ways: list[tuple[LoggerHandle, str, Egress]] = []

    # what the pool holds ------------------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self._handles)

    def get(self, node_id: str) -> LoggerHandle | None:
        return self._handles.get(node_id)

    def handles(self) -> list[LoggerHandle]:
        return list(self._handles.values())

    def runs_by_node(self) -> dict[str, set[str]]:
        return {node_id: set(h.runs) for node_id, h in self._handles.items()}

    def host_of(self, run_id: str) -> LoggerHandle | None:
        """The logger hosting ``run_id``'s writer (a standalone run has one)."""
        return next((h for h in self._handles.values() if run_id in h.runs), None)

    # writers --------------------------------------------------------------------------------------
    def prestart(self, nodes: list[NodeInfo]) -> None:
        """Loggers ahead of the train workers' placement, wandb's service started in each, on
        those of ``nodes`` without one: a join is then only the run handshake."""
        new = [n for n in nodes if n.node_id not in self._handles]
        self.start(new)
        for node in new:
            handle = self._handles[node.node_id]
            handle.warm = True
            handle.actor.warm.remote()

    def drop_unused_warm(self, wanted: set[str]) -> None:
        """Drop the loggers started ahead that got no writer and no run wants."""
        for node_id, handle in list(self._handles.items()):
            if handle.warm and not handle.runs and node_id not in wanted:
                self.drop(node_id)

    def add_writer(self, node_id: str, spec: WriterSpec) -> LoggerHandle:
        """Start ``spec``'s writer in the logger of ``node_id``; that logger's handle."""
        handle = self._handles[node_id]
        handle.warm = False
        handle.runs.add(spec.run_id)
        self._join(handle, spec)
        return handle

    def finish_writer(self, node_id: str, run_id: str, exit_code: int | None = None) -> Any:
        """Finish one writer (the actor stays for other runs); the ref of its status."""
        handle = self._handles[node_id]
        handle.runs.discard(run_id)
        return handle.actor.finish.remote(run_id, exit_code)

    def _join(self, handle: LoggerHandle, spec: WriterSpec) -> None:
        ref = handle.actor.add_writer.remote(spec, self.egress)
        self._joins.append(_Join(handle=handle, run_id=spec.run_id, ref=ref, started=self._clock()))

    def joining(self, run_id: str) -> bool:
        """Whether a join of a writer of ``run_id`` (a run id or an observer key) has not answered."""
        return any(run_of(j.run_id)[0] == run_of(run_id)[0] for j in self._joins)

    def take_ways(self) -> list[tuple[LoggerHandle, str, Egress]]:
        """The ways to W&B the joins that answered since the last call found: (logger, writer key, way)."""
        ways, self._ways = self._ways, []
        return ways

    def check_joins(self) -> None:
        """Turn each writer's join result into one warning when it could not join."""
        if not self._joins:
            return
        ready_set = self._actors.answered([j.ref for j in self._joins])
        now = self._clock()
        still: list[_Join] = []
        for join in self._joins:
            if join.ref in ready_set:
                self.joined.add((join.handle.node.node_id, join.run_id))
                self.check_status(join.handle, join.ref, join.run_id)
            elif now - join.started > self._init_timeout_s + JOIN_GRACE_S:
                self._warner.warn(
                    f"join-timeout:{join.handle.node.node_id}:{join.run_id}",
                    f"the node writer on {join.handle.node.label} has not joined the W&B run {join.run_id} after "
                    f"{now - join.started:.0f}s; that node's system metrics may be missing",
                )
                self.joined.add((join.handle.node.node_id, join.run_id))
            else:
                still.append(join)
        self._joins = still

    def answered(self, refs: list[Any]) -> set[Any]:
        """Those of ``refs`` (calls on the loggers) that have answered, without waiting."""
        return self._actors.answered(refs)

    def result(self, ref: Any) -> Any:
        """The answer of a call that has answered; raises when the call or its logger failed."""
        return self._actors.result(ref)

    def check_status(self, handle: LoggerHandle, ref: Any, run_id: str | None = None) -> LoggerStatus | None:
        """Turn a finished status call into one warning per problem it shows; the status (None:
        the call failed)."""
        try:
            status: LoggerStatus = self._actors.result(ref)
        except Exception as e:  # noqa: BLE001 - the actor died or could not be created
            self._warner.warn(
                f"node-dead:{handle.node.node_id}",
                f"the node logger on {handle.node.label} failed, so that node's system metrics are missing "
                f"({describe(e)})",
            )
            return None
        if handle.pid is None:
            handle.pid = status.pid
        self._took_summary(handle, status)
        if run_id is not None and run_id in status.egress:  # a join's answer: the way its checks found
            self._ways.append((handle, run_id, status.egress[run_id]))
        for rid, error in status.errors.items():
            if run_id is None or rid == run_id:
                self._warner.warn(
                    f"node-init:{handle.node.node_id}:{rid}",
                    f"the node writer on {handle.node.label} could not join the W&B run {rid}; "
                    f"that node's system metrics are missing ({error})",
                )
        return status

    # health -----------------------------------------------------------------------------------------
    def check_health(self, spec_for: Callable[[str, NodeInfo], WriterSpec | None]) -> None:
        """Ping the loggers in turn (at most ``PING_BATCH`` new pings a tick, each logger at most
        every ``ping_s``); one that restarted (its process died) gets its writers back.

        Logger actors restart where their bundle is (``max_restarts=-1``) with no writers;
        each rejoins its run with the same label (``spec_for(run id, node)``, None for a run
        that ended meanwhile). One that is gone for good is dropped, so the next plan replaces it.
        The work a tick is bounded by the pings in flight, whatever the number of loggers.
        """
        for handle, ref in self._pings.answered(self._actors):
            self._pinged(handle, ref, spec_for)
        self._pings.send(self._handles, self._clock(), self._joining)

    def _joining(self, handle: LoggerHandle) -> set[str]:
        """``handle``'s writers whose join has not answered yet."""
        return {j.run_id for j in self._joins if j.handle is handle}

    def _pinged(self, handle: LoggerHandle, ref: Any, spec_for: Callable[[str, NodeInfo], WriterSpec | None]) -> None:
        try:
            status = self._actors.result(ref)
        except Exception as e:  # noqa: BLE001 - the actor is gone and will not restart
            self._warner.warn(
                f"node-lost:{handle.node.node_id}",
                f"the node logger on {handle.node.label} stopped ({describe(e)}); starting another",
            )
            self.drop(handle.node.node_id)
            self.changed = True
            return
        self._took_summary(handle, status)
        self._rejoin(handle, status, spec_for)

    def _took_summary(self, handle: LoggerHandle, status: LoggerStatus) -> None:
        handle.progress, handle.progress_at = status.progress, self._clock()
        handle.steps = merged_steps(handle.steps, status.steps)
        handle.ranks_memory = status.ranks_memory
        summary = status.summary
        if summary is not None and summary is not handle.summary:
            handle.summary = summary
            self._updated.add(handle.node.node_id)
            handle.summaries = {run_of(key)[0]: s for key, s in status.summaries.items()}
        self._said(handle.node, status)

    def _said(self, node: NodeInfo, status: LoggerStatus) -> None:
        """What a logger's status says: its readers' problems (rare: once per node and cause) and
        its writers' warnings (a checkpoint left out of its artifact), each once (the warner keeps
        what it said)."""
        for key, text in status.warnings.items():
            self._warner.warn(f"node-said:{key}", text)
        for problems in status.problems.values():
            for p in problems:
                self._warner.warn(f"{p.kind}:{node.node_id}:{p.cause}", read_warning(node.label, p))

    def take_updated(self) -> set[str]:
        """The nodes whose summary changed since the last call."""
        updated, self._updated = self._updated, set()
        return updated

    def updated_now(self) -> set[str]:
        """The nodes whose summary changed since :meth:`take_updated` was last called, left there."""
        return set(self._updated)

    def _rejoin(
        self, handle: LoggerHandle, status: LoggerStatus, spec_for: Callable[[str, NodeInfo], WriterSpec | None]
    ) -> None:
        # A new pid, or Ray's own count: a call in flight when the process died is retried
        # on the new one, so the first status seen may already come from it.
        restarted = (handle.pid is not None and status.pid != handle.pid) or status.restarted
        handle.pid = status.pid
        # Only writers whose join answered before the ping can be missing from its answer.
        missing = (handle.runs & handle.ping_runs) - set(status.runs) - set(status.errors)
        if restarted:  # a new process watches nothing: the next plan asks it again (watches.py, consoles.py)
            handle.watching, handle.consoles, self.changed = {}, {}, True
        if restarted or missing:
            self._warner.warn(
                f"node-restart:{handle.node.node_id}:{handle.pid}",
                f"the node logger on {handle.node.label} restarted; its writers rejoin their runs with the same label",
            )
        for run_id in sorted(missing):
            spec = spec_for(run_id, handle.node)
            if spec is None:
                handle.runs.discard(run_id)
            else:
                self._join(handle, spec)

    # actors and placement groups ---------------------------------------------------------------------
    def start(self, nodes: list[NodeInfo]) -> None:
        """One logger actor on each of ``nodes``, each in a placement group of its own."""
        if not nodes:
            return
        prefix = self._actors.group_prefix()
        for node in nodes:
            actor, pg = self._actors.create(node.node_id, f"{prefix}{next(self._group_ids)}")
            with self._lock:
                self._handles[node.node_id] = LoggerHandle(node=node, actor=actor, pg=pg)
            self._pings.add(node.node_id)

    def drop(self, node_id: str) -> LoggerHandle | None:
        """Kill the logger of ``node_id`` and forget it; its handle, if there was one."""
        with self._lock:
            handle = self._handles.pop(node_id, None)
        if handle is not None:
            self._kill(handle)
        return handle

    def _kill(self, handle: LoggerHandle) -> None:
        self._pings.drop(handle.node.node_id)
        self._actors.kill(handle.actor, handle.pg)

    def kill_all(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            self._kill(handle)
        self._actors.close()
