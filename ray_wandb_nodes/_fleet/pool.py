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

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import _ray
from .._warn import Warner, describe
from .._writers import WriterSpec
from .nodes import NodeInfo

# A bundle must hold some resource; a little memory never competes with train workers,
# whereas a CPU fraction can leave whole-CPU workers unschedulable forever.
BUNDLE = {"memory": float(1 << 20)}
PG_NAME_PREFIX = "ray_wandb_nodes"
JOIN_GRACE_S = 60.0  # scheduling and process start, on top of wandb's init timeout


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
    summary: dict[str, Any] | None = None  # its node's latest samples, as the last ping brought


@dataclass
class _Join:
    handle: LoggerHandle
    run_id: str
    ref: Any
    started: float


class LoggerPool:
    def __init__(self, *, init_timeout_s: float, warner: Warner, ping_s: float) -> None:
        self._init_timeout_s = init_timeout_s
        self._warner = warner
        self._ping_s = ping_s
        self._handles: dict[str, LoggerHandle] = {}
        self._joins: list[_Join] = []
        self._group_ids = itertools.count()
        self._lock = threading.Lock()
        self._actor_cls: Any = None
        self._janitor: Any = None

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
    def add_writer(self, node_id: str, spec: WriterSpec) -> LoggerHandle:
        """Start ``spec``'s writer in the logger of ``node_id``; that logger's handle."""
        handle = self._handles[node_id]
        handle.runs.add(spec.run_id)
        self._join(handle, spec)
        return handle

    def finish_writer(self, node_id: str, run_id: str, exit_code: int | None = None) -> Any:
        """Finish one writer (the actor stays for other runs); the ref of its status."""
        handle = self._handles[node_id]
        handle.runs.discard(run_id)
        return handle.actor.finish.remote(run_id, exit_code)

    def _join(self, handle: LoggerHandle, spec: WriterSpec) -> None:
        ref = handle.actor.add_writer.remote(spec)
        self._joins.append(_Join(handle=handle, run_id=spec.run_id, ref=ref, started=time.monotonic()))

    def check_joins(self) -> None:
        """Turn each writer's join result into one warning when it could not join."""
        import ray

        if not self._joins:
            return
        ready, _ = ray.wait([j.ref for j in self._joins], num_returns=len(self._joins), timeout=0)
        ready_set = set(ready)
        now = time.monotonic()
        still: list[_Join] = []
        for join in self._joins:
            if join.ref in ready_set:
                self.check_status(join.handle, join.ref, join.run_id)
            elif now - join.started > self._init_timeout_s + JOIN_GRACE_S:
                self._warner.warn(
                    f"join-timeout:{join.handle.node.node_id}:{join.run_id}",
                    f"the node writer on {join.handle.node.label} has not joined the W&B run {join.run_id} after "
                    f"{now - join.started:.0f}s; that node's system metrics may be missing",
                )
            else:
                still.append(join)
        self._joins = still

    def check_status(self, handle: LoggerHandle, ref: Any, run_id: str | None = None) -> None:
        """Turn a finished status call into one warning per problem it shows."""
        import ray

        try:
            status = ray.get(ref, timeout=0)
        except Exception as e:  # noqa: BLE001 - the actor died or could not be created
            self._warner.warn(
                f"node-dead:{handle.node.node_id}",
                f"the node logger on {handle.node.label} failed, so that node's system metrics are missing "
                f"({describe(e)})",
            )
            return
        if handle.pid is None:
            handle.pid = status.get("pid")
        for rid, error in status.get("errors", {}).items():
            if run_id is None or rid == run_id:
                self._warner.warn(
                    f"node-init:{handle.node.node_id}:{rid}",
                    f"the node writer on {handle.node.label} could not join the W&B run {rid}; "
                    f"that node's system metrics are missing ({error})",
                )

    # health -----------------------------------------------------------------------------------------
    def check_health(self, spec_for: Callable[[str, NodeInfo], WriterSpec | None]) -> None:
        """Ping each logger; one that restarted (its process died) gets its writers back.

        Logger actors restart where their bundle is (``max_restarts=-1``) with no writers;
        each rejoins its run with the same label (``spec_for(run id, node)``, None for a run
        that ended meanwhile). One that is gone for good is dropped, so the next plan replaces it.
        """
        import ray

        now = time.monotonic()
        for handle in list(self._handles.values()):
            if handle.ping is None:
                if handle.runs and now - handle.pinged >= self._ping_s:
                    handle.ping, handle.pinged = handle.actor.status.remote(), now
                continue
            if not ray.wait([handle.ping], timeout=0)[0]:
                continue
            ref, handle.ping = handle.ping, None
            try:
                status = ray.get(ref, timeout=0)
            except Exception as e:  # noqa: BLE001 - the actor is gone and will not restart
                self._warner.warn(
                    f"node-lost:{handle.node.node_id}",
                    f"the node logger on {handle.node.label} stopped ({describe(e)}); starting another",
                )
                self.drop(handle.node.node_id)
                continue
            handle.summary = status.get("summary") or handle.summary
            self._rejoin(handle, status, spec_for)

    def _rejoin(
        self, handle: LoggerHandle, status: dict[str, Any], spec_for: Callable[[str, NodeInfo], WriterSpec | None]
    ) -> None:
        # A new pid, or Ray's own count: a call in flight when the process died is retried
        # on the new one, so the first status seen may already come from it.
        restarted = (handle.pid is not None and status.get("pid") != handle.pid) or bool(status.get("restarted"))
        handle.pid = status.get("pid")
        missing = handle.runs - set(status.get("runs", ())) - set(status.get("errors", {}))
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
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = _logger_actor_class()
        prefix = self._pg_prefix()
        self._start_janitor()
        for node in nodes:
            pg = placement_group(
                [dict(BUNDLE)],
                strategy="STRICT_SPREAD",
                name=f"{prefix}{next(self._group_ids)}",
                **_ray.pin_bundles_to_nodes([node.node_id]),
            )
            actor = self._actor_cls.options(
                num_cpus=0,
                # A killed logger process comes back in its bundle; calls in flight are retried.
                max_restarts=-1,
                max_task_retries=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=0
                ),
            ).remote()
            with self._lock:
                self._handles[node.node_id] = LoggerHandle(node=node, actor=actor, pg=pg)

    def _pg_prefix(self) -> str:
        from .janitor import group_prefix

        owner = _ray.current_actor_id()
        return group_prefix(owner) if owner else f"{PG_NAME_PREFIX}:driver:"

    def _start_janitor(self) -> None:
        """Inside an actor (the Train controller), start the detached janitor that removes the
        pool's placement groups should the actor die; a driver's groups end with its job."""
        import ray

        owner = _ray.current_actor_id()
        if owner is None or self._janitor is not None:
            return
        try:
            from .janitor import LoggerJanitor

            self._janitor = (
                ray.remote(LoggerJanitor)
                .options(num_cpus=0, lifetime="detached", max_concurrency=2, namespace=PG_NAME_PREFIX)
                .remote(owner)
            )
        except Exception as e:  # noqa: BLE001
            self._warner.warn("janitor", f"placement groups may outlive a crashed controller ({describe(e)})")

    def drop(self, node_id: str) -> LoggerHandle | None:
        """Kill the logger of ``node_id`` and forget it; its handle, if there was one."""
        with self._lock:
            handle = self._handles.pop(node_id, None)
        if handle is not None:
            self._kill(handle)
        return handle

    def _kill(self, handle: LoggerHandle) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            ray.kill(handle.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            if handle.pg is not None:
                remove_placement_group(handle.pg)
        except Exception:  # noqa: BLE001 - already removed
            pass

    def kill_all(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            self._kill(handle)
        if self._janitor is not None:
            try:
                self._janitor.stop.remote()
            except Exception:  # noqa: BLE001
                pass
            self._janitor = None


def _logger_actor_class() -> Any:
    import ray

    from .node_logger import NodeLogger

    return ray.remote(NodeLogger)
