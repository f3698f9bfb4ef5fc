"""The logger pool: one ``NodeLogger`` actor per node, and the driver side's handle of each.

It places the actors (a placement group per node: one bundle of a little memory, pinned by the
node's NodeID label, so that a lost node's group goes with it; on Ray 2.50 a group left
rescheduling for a dead node holds back every group created after it, the train workers'
included), starts the janitor that removes those groups should the owner die, adds and finishes
writers, watches their joins, and pings each logger so that one whose process restarted gets
its writers back. It runs on the fleet's thread only; ``kill_all()`` may be called from elsewhere.

:class:`LoggerPool` holds the handles (``handle.py``) and the order of things; its jobs are each a
module's: the joins in flight (``joins.py``), the pings in turn (``pings.py``) and the statuses
taken in (``intake.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from .._egress import Egress, WriterEgress
from .._wandb.writers import WriterSpec
from .._warn import Warner, describe
from .actors import BUNDLE, PG_NAME_PREFIX, RayActors
from .handle import LoggerHandle
from .intake import StatusIntake
from .joins import JOIN_GRACE_S, Joins
from .nodes import NodeInfo
from .pings import PING_BATCH, PingTurn
from .wire import LoggerStatus

__all__ = ["BUNDLE", "JOIN_GRACE_S", "PG_NAME_PREFIX", "PING_BATCH", "LoggerHandle", "LoggerPool"]


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
        self._warner = warner
        self._actors = actors or RayActors(warner)
        self._clock = clock
        self._handles: dict[str, LoggerHandle] = {}
        self._joins = Joins(init_timeout_s=init_timeout_s, warner=warner, actors=self._actors, clock=clock)
        self._group_ids = itertools.count()
        self._lock = threading.Lock()
        self._pings = PingTurn(ping_s)
        self._intake = StatusIntake(warner, self._actors, clock)
        self.changed = False  # a logger was lost or restarted: the fleet re-plans
        # What each online writer gets to find its way to W&B (the relay's route, once the run's
        # relay listens).
        self.egress = WriterEgress()

    @property
    def joined(self) -> set[tuple[str, str]]:
        """(node, writer key) of every join that has answered (joined, failed or timed out)."""
        return self._joins.joined

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
        self._joins.add(handle, spec.run_id, handle.actor.add_writer.remote(spec, self.egress))

    def joining(self, run_id: str) -> bool:
        """Whether a join of a writer of ``run_id`` (a run id or an observer key) has not answered."""
        return self._joins.joining(run_id)

    def take_ways(self) -> list[tuple[LoggerHandle, str, Egress]]:
        """The ways to W&B the joins that answered since the last call found: (logger, writer key, way)."""
        return self._intake.take_ways()

    def check_joins(self) -> None:
        """Turn each writer's join result into one warning when it could not join."""
        self._joins.check(self.check_status)

    def answered(self, refs: list[Any]) -> set[Any]:
        """Those of ``refs`` (calls on the loggers) that have answered, without waiting."""
        return self._actors.answered(refs)

    def result(self, ref: Any) -> Any:
        """The answer of a call that has answered; raises when the call or its logger failed."""
        return self._actors.result(ref)

    def check_status(self, handle: LoggerHandle, ref: Any, run_id: str | None = None) -> LoggerStatus | None:
        """Turn a finished status call into one warning per problem it shows; the status (None:
        the call failed)."""
        return self._intake.check_status(handle, ref, run_id)

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
        self._pings.send(self._handles, self._clock(), self._joins.of)

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
        self._intake.took(handle, status)
        self._rejoin(handle, status, spec_for)

    def take_updated(self) -> set[str]:
        """The nodes whose summary changed since the last call."""
        return self._intake.take_updated()

    def updated_now(self) -> set[str]:
        """The nodes whose summary changed since :meth:`take_updated` was last called, left there."""
        return self._intake.updated_now()

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
