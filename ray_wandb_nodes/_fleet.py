"""The node fleet: one ``NodeLogger`` actor per selected node, kept in step with the cluster.

Everything here runs on one background thread of the Train controller (or Tune driver):
hooks only hand it the latest worker placement. The thread waits for the primary to
create the run, then reconciles: nodes that came get a logger (one placement group per
batch, STRICT_SPREAD, one bundle of a little memory per node, pinned to the node by its
NodeID label), nodes that left have theirs finished and retired. It also polls
``ray.nodes()`` so dead nodes are retired, and, with ``nodes="cluster"``, new nodes join.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._nodes import NodeInfo, alive_nodes, reconcile, select_nodes
from ._primary import PrimaryWriter
from ._warn import Warner, describe
from ._writers import WriterSpec, node_spec

# A bundle must hold some resource; a little memory never competes with train workers,
# whereas a CPU fraction can leave whole-CPU workers unschedulable forever.
BUNDLE = {"memory": float(1 << 20)}
NODE_ID_LABEL = "ray.io/node-id"
PG_NAME_PREFIX = "ray_wandb_nodes"
POLL_S = 5.0
_JOIN_GRACE_S = 60.0  # scheduling and process start, on top of wandb's init timeout


@dataclass
class _Logger:
    node: NodeInfo
    actor: Any
    pg_key: int
    ready_ref: Any
    started: float
    joined: bool = False


@dataclass
class _Group:
    pg: Any
    nodes: set[str] = field(default_factory=set)


def _logger_actor_class() -> Any:
    import ray

    from ._node_logger import NodeLogger

    return ray.remote(NodeLogger)


class NodeFleet:
    def __init__(
        self,
        *,
        selection: str,
        primary_node_id: str | None,
        primary: PrimaryWriter,
        init_timeout_s: float,
        warner: Warner,
        poll_s: float = POLL_S,
        spec_for: Callable[[PrimaryWriter, NodeInfo], WriterSpec] | None = None,
    ) -> None:
        self._selection = selection
        self._primary_node_id = primary_node_id
        self._primary = primary
        self._init_timeout_s = init_timeout_s
        self._warner = warner
        self._poll_s = poll_s
        self._spec_for = spec_for or (lambda p, n: node_spec(p.spec, label=n.label, entity=p.entity, project=p.project))
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._worker_nodes: set[str] = set()
        self._loggers: dict[str, _Logger] = {}
        self._groups: dict[int, _Group] = {}
        self._group_ids = itertools.count()
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-fleet", daemon=True)
        self._actor_cls: Any = None

    # called from hooks: never blocks ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def set_worker_nodes(self, node_ids: Iterable[str]) -> None:
        self._commands.put(("workers", set(node_ids)))

    def labels(self) -> dict[str, str]:
        """node id -> label of the current loggers (for diagnostics and tests)."""
        with self._lock:
            return {nid: lg.node.label for nid, lg in self._loggers.items()}

    def finish(self, timeout: float) -> None:
        """Finish every node writer (bounded by ``timeout``), then kill the actors and groups."""
        if not self._thread.ident:
            return
        self._commands.put(("finish", timeout))
        if not self._finished.wait(timeout + 10.0):
            self._warner.warn("fleet:stuck", "node loggers did not stop in time; killing them")
        self._kill_all()

    # the fleet thread ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while True:
                wait = self._poll_s if self._primary.ready else 0.2
                try:
                    kind, payload = self._commands.get(timeout=wait)
                except queue.Empty:
                    kind, payload = "poll", None
                if kind == "finish":
                    self._finish_writers(payload)
                    return
                if kind == "workers":
                    self._worker_nodes = payload
                try:
                    self._check_joined()
                    if self._primary.ready:
                        self._reconcile()
                except Exception as e:  # noqa: BLE001 - the fleet must outlive any one failure
                    self._warner.warn(f"fleet:{type(e).__name__}", f"node loggers could not be updated ({describe(e)})")
        finally:
            self._finished.set()

    def _reconcile(self) -> None:
        import ray

        alive = alive_nodes(ray.nodes())
        wanted = select_nodes(self._selection, self._worker_nodes, alive, self._primary_node_id)
        with self._lock:
            current = list(self._loggers)
        to_add, to_retire = reconcile(current, wanted)
        if to_retire:
            self._retire(to_retire, alive)
        if to_add:
            self._add([wanted[nid] for nid in to_add])

    def _add(self, nodes: list[NodeInfo]) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = _logger_actor_class()
        key = next(self._group_ids)
        pg = placement_group(
            [dict(BUNDLE) for _ in nodes],
            strategy="STRICT_SPREAD",
            bundle_label_selector=[{NODE_ID_LABEL: n.node_id} for n in nodes],
            name=f"{PG_NAME_PREFIX}:{self._primary.spec.run_id}:{key}",
        )
        group = _Group(pg=pg)
        now = time.monotonic()
        for index, node in enumerate(nodes):
            spec = self._spec_for(self._primary, node)
            actor = self._actor_cls.options(
                num_cpus=0,
                max_restarts=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=index
                ),
            ).remote([spec])
            group.nodes.add(node.node_id)
            with self._lock:
                self._loggers[node.node_id] = _Logger(
                    node=node, actor=actor, pg_key=key, ready_ref=actor.status.remote(), started=now
                )
        with self._lock:
            self._groups[key] = group

    def _retire(self, node_ids: list[str], alive: dict[str, NodeInfo]) -> None:
        import ray

        with self._lock:
            leaving = [self._loggers.pop(nid) for nid in node_ids if nid in self._loggers]
        # Finish the writers on nodes that are still alive (bounded); dead nodes have none left.
        refs = [lg.actor.finish.remote() for lg in leaving if lg.node.node_id in alive]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=min(30.0, self._init_timeout_s))
        for lg in leaving:
            self._kill(lg)

    def _check_joined(self) -> None:
        """Turn each logger's first status into a warning when its writer could not join."""
        import ray

        with self._lock:
            pending = [lg for lg in self._loggers.values() if not lg.joined]
        if not pending:
            return
        ready, _ = ray.wait([lg.ready_ref for lg in pending], num_returns=len(pending), timeout=0)
        ready_set = set(ready)
        now = time.monotonic()
        for lg in pending:
            if lg.ready_ref in ready_set:
                lg.joined = True
                self._report(lg, lg.ready_ref)
            elif now - lg.started > self._init_timeout_s + _JOIN_GRACE_S:
                lg.joined = True  # stop checking; say it once
                self._warner.warn(
                    f"join-timeout:{lg.node.node_id}",
                    f"the node logger on {lg.node.label} has not joined the run after "
                    f"{now - lg.started:.0f}s; that node's system metrics may be missing",
                )

    def _report(self, lg: _Logger, ref: Any) -> None:
        """Turn a finished status call into one warning per problem it shows."""
        import ray

        try:
            status = ray.get(ref, timeout=0)
        except Exception as e:  # noqa: BLE001 - the actor died or could not be created
            self._warner.warn(
                f"node-dead:{lg.node.node_id}",
                f"the node logger on {lg.node.label} failed, so that node's system metrics are missing ({describe(e)})",
            )
            return
        for run_id, error in status.get("errors", {}).items():
            self._warner.warn(
                f"node-init:{lg.node.node_id}:{run_id}",
                f"the node writer on {lg.node.label} could not join the W&B run {run_id}; "
                f"that node's system metrics are missing ({error})",
            )

    def _finish_writers(self, timeout: float) -> None:
        """Node writers finish first, in parallel, each bounded: the primary's state is the last word."""
        import ray

        with self._lock:
            loggers = list(self._loggers.values())
        if not loggers:
            return
        refs = {lg.actor.finish.remote(): lg for lg in loggers}
        done, not_done = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in done:
            self._report(refs[ref], ref)
        if not_done:
            labels = ", ".join(sorted(refs[r].node.label for r in not_done))
            self._warner.warn(
                "node-finish-timeout",
                f"node writer(s) {labels} did not finish within {timeout:.0f}s; their last samples may be missing",
            )

    def _kill(self, lg: _Logger) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            ray.kill(lg.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        with self._lock:
            group = self._groups.get(lg.pg_key)
            if group is None:
                return
            group.nodes.discard(lg.node.node_id)
            if group.nodes:
                return
            del self._groups[lg.pg_key]
        try:
            remove_placement_group(group.pg)
        except Exception:  # noqa: BLE001
            pass

    def _kill_all(self) -> None:
        with self._lock:
            loggers = list(self._loggers.values())
            self._loggers.clear()
        for lg in loggers:
            self._kill(lg)
