"""The node fleet: one ``NodeLogger`` actor per node, hosting one writer per W&B run.

Everything here runs on one background thread (of the Train controller or the Tune
driver): hooks only hand it data. The fleet holds *run targets*: for each W&B run, the
nodes it uses. Once a run's primary has created the run, the thread reconciles: a node
that a run uses gets a logger actor if it has none (one placement group per batch of new
nodes, STRICT_SPREAD, one bundle of a little memory per node, pinned by its NodeID label)
and a writer for that run inside it; writers of runs that no longer use a node finish;
loggers on dead nodes are killed. It re-reads ``ray.nodes()`` every few seconds, so dead
nodes are retired and, with ``nodes="cluster"``, new nodes join. One actor per node serves
every run on that node, so the cost grows with nodes, not runs times nodes.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._metrics import to_row
from ._nodes import NodeInfo, alive_nodes, select_nodes
from ._primary import PrimaryWriter, warn_skipped
from ._warn import Warner, describe
from ._writers import WriterSpec, node_spec, offline_index
from .offline.index import OfflineIndex, node_local_dir
from .offline.storage import StorageSpot, fetch, remove, remove_folder_if_empty
from .offline.transfer import MAX_COLLECT_BYTES, receive

# A bundle must hold some resource; a little memory never competes with train workers,
# whereas a CPU fraction can leave whole-CPU workers unschedulable forever.
BUNDLE = {"memory": float(1 << 20)}
NODE_ID_LABEL = "ray.io/node-id"
PG_NAME_PREFIX = "ray_wandb_nodes"
POLL_S = 3.0
_BUSY_POLL_S = 0.2  # while runs are being retired or primaries are starting
_RELAY_POLL_S = 1.0  # while a run learns its nodes from elsewhere (a Train run inside a trial)
_MAX_PENDING_ROWS = 10_000
_JOIN_GRACE_S = 60.0  # scheduling and process start, on top of wandb's init timeout


@dataclass
class RunTarget:
    """One W&B run's wish: writers on the nodes it uses.

    A shared run has a ``primary`` that creates it; the fleet's writers only join once it
    has. A run of the node or all strategy has none: its one writer, on its node, is the
    run (``standalone``), and the fleet routes its history rows there.
    """

    primary: PrimaryWriter | None
    selection: str  # "workers": the nodes in `nodes`; "cluster": every alive node
    nodes: set[str] = field(default_factory=set)
    # The node whose metrics the primary reports itself (no node writer there); None when
    # the primary samples no system metrics.
    covered_node: str | None = None
    # Polled on every reconcile for more nodes (e.g. a Train run inside a Tune trial).
    extra_nodes: Callable[[], Iterable[str]] | None = None
    spec_for: Callable[[PrimaryWriter, NodeInfo], WriterSpec] | None = None
    standalone: WriterSpec | None = None
    excludes: tuple[str, ...] = ()
    # Offline mode: the run's folder index; the fleet brings every node writer's run there,
    # through ``storage`` when set (the run's storage), else through Ray.
    index: OfflineIndex | None = None
    storage: StorageSpot | None = None

    def __post_init__(self) -> None:
        if self.index is None:
            if self.primary is not None:
                self.index = self.primary.index
            elif self.standalone is not None:
                self.index = offline_index(self.standalone)

    @property
    def role(self) -> str:
        """The role of this run's writers on the nodes: joined writers, or runs of their own."""
        return "run" if self.standalone is not None else "node"

    @property
    def run_id(self) -> str:
        if self.standalone is not None:
            return self.standalone.run_id
        assert self.primary is not None
        return self.primary.spec.run_id

    @property
    def ready(self) -> bool:
        return self.primary.ready if self.primary is not None else True

    @property
    def starting(self) -> bool:
        return self.primary is not None and not self.primary.ready and not self.primary.failed

    def spec(self, node: NodeInfo) -> WriterSpec:
        if self.standalone is not None:
            return self.standalone
        p = self.primary
        assert p is not None
        if self.spec_for is not None:
            return self.spec_for(p, node)
        return node_spec(p.spec, label=node.label, entity=p.entity, project=p.project)


@dataclass
class _Logger:
    node: NodeInfo
    actor: Any
    pg_key: int
    runs: set[str] = field(default_factory=set)
    ping: Any = None  # an outstanding status() call
    pinged: float = 0.0
    pid: int | None = None  # of the logger's process, to notice a restart


@dataclass
class _Join:
    logger: _Logger
    run_id: str
    ref: Any
    started: float


@dataclass
class _Retirement:
    run_id: str
    refs: dict[Any, _Logger]
    deadline: float
    timeout: float
    then: Callable[[], None] | None
    # offline: the run's folder index, which node writers hosted the run, and their collectors
    index: OfflineIndex | None = None
    sources: list[_Logger] = field(default_factory=list)
    role: str = "node"
    storage: StorageSpot | None = None
    collectors: list[threading.Thread] | None = None
    collect_deadline: float = 0.0
    recorded: set[str] = field(default_factory=set)  # labels whose index entry the collectors wrote


@dataclass
class _Group:
    pg: Any
    nodes: set[str] = field(default_factory=set)


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic), at least 0.1: a bound for one Ray call."""
    return max(0.1, deadline - time.monotonic())


def _logger_actor_class() -> Any:
    import ray

    from ._node_logger import NodeLogger

    return ray.remote(NodeLogger)


class NodeFleet:
    def __init__(self, *, init_timeout_s: float, warner: Warner, poll_s: float = POLL_S) -> None:
        self._init_timeout_s = init_timeout_s
        self._warner = warner
        self._poll_s = poll_s
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._targets: dict[str, RunTarget] = {}
        self._loggers: dict[str, _Logger] = {}
        self._groups: dict[int, _Group] = {}
        self._joins: list[_Join] = []
        self._retirements: list[_Retirement] = []
        self._pending_rows: dict[str, list[dict[str, Any]]] = {}  # rows for writers not placed yet
        # node id -> offline runs that had a writer there and are not collected yet; kept per
        # node, so that a logger that was replaced still has its runs collected
        self._hosted: dict[str, set[str]] = {}
        # run id -> nodes whose offline data is being collected: no new writer of that run there
        # until it is done (a restarted Tune trial keeps its run id and would reuse the folder)
        self._collecting: dict[str, set[str]] = {}
        self._group_ids = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-fleet", daemon=True)
        self._actor_cls: Any = None
        self._janitor: Any = None

    # called from hooks: never blocks ---------------------------------------------------------
    def start(self) -> None:
        if not self._thread.ident:
            self._thread.start()

    def add_run(self, target: RunTarget) -> None:
        self._commands.put(("add", target))

    def set_run_nodes(self, run_id: str, nodes: Iterable[str], covered_node: str | None = None) -> None:
        """The nodes a run uses now (replaces the previous set), and the primary's own node."""
        self._commands.put(("nodes", (run_id, set(nodes), covered_node)))

    def log_artifact(self, run_id: str, checkpoint: Any, name: str, aliases: list[str]) -> None:
        """A checkpoint artifact for a standalone run, logged by the actor hosting it."""
        self._commands.put(("artifact", (run_id, checkpoint, name, aliases)))

    def log(self, run_id: str, metrics: dict[str, Any]) -> None:
        """A history row for a standalone run, delivered to the actor hosting it (in order)."""
        self._commands.put(("log", (run_id, metrics)))

    def retire_run(
        self, run_id: str, timeout: float, then: Callable[[], None] | None = None, exit_code: int | None = None
    ) -> None:
        """Finish the run's writers (bounded by ``timeout``), then call ``then``.

        ``then`` finishes the primary: node writers end first so that no late write reopens a
        run whose final state the primary has sent. A standalone run's writer finishes with
        ``exit_code``; a joining writer never sends the run's state.
        """
        self._commands.put(("retire", (run_id, timeout, then, exit_code)))

    def labels(self) -> dict[str, str]:
        """node id -> label of the current loggers (for diagnostics and tests)."""
        with self._lock:
            return {nid: lg.node.label for nid, lg in self._loggers.items()}

    def shutdown(self, timeout: float) -> None:
        """Retire every run still open, then kill every actor and placement group (bounded)."""
        if self._thread.ident:
            self._commands.put(("shutdown", timeout))
            if not self._stopped.wait(timeout + 10.0):
                self._warner.warn("fleet:stuck", "node loggers did not stop in time; killing them")
        self._kill_all()

    # the fleet thread ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while True:
                busy = self._retirements or any(t.starting for t in self._targets.values())
                relay = any(t.extra_nodes is not None for t in self._targets.values())
                wait = _BUSY_POLL_S if busy else min(self._poll_s, _RELAY_POLL_S) if relay else self._poll_s
                try:
                    kind, payload = self._commands.get(timeout=wait)
                except queue.Empty:
                    kind, payload = "poll", None
                if kind == "shutdown":
                    self._shutdown(payload)
                    return
                try:
                    self._apply(kind, payload)
                    self._check_joins()
                    self._check_health()
                    self._reconcile()
                    self._check_retirements()
                except Exception as e:  # noqa: BLE001 - the fleet must outlive any one failure
                    self._warner.warn(f"fleet:{type(e).__name__}", f"node loggers could not be updated ({describe(e)})")
        finally:
            self._stopped.set()

    def _apply(self, kind: str, payload: Any) -> None:
        if kind == "add":
            self._targets[payload.run_id] = payload
        elif kind == "nodes":
            run_id, nodes, covered = payload
            target = self._targets.get(run_id)
            if target is not None:
                target.nodes = nodes
                target.covered_node = covered
        elif kind == "retire":
            run_id, timeout, then, exit_code = payload
            self._start_retirement(run_id, timeout, then, exit_code)
        elif kind == "log":
            run_id, metrics = payload
            self._route(run_id, metrics)
        elif kind == "artifact":
            run_id = payload[0]
            host = next((lg for lg in self._loggers.values() if run_id in lg.runs), None)
            if host is not None:
                host.actor.log_artifact.remote(*payload)
            else:
                self._warner.warn(
                    f"artifact:{run_id}", f"a checkpoint of {run_id} was not logged: its writer is not placed"
                )

    def _wanted(self, alive: dict[str, NodeInfo]) -> dict[str, dict[str, RunTarget]]:
        """node id -> run id -> target, for every run whose primary has created its run."""
        wanted: dict[str, dict[str, RunTarget]] = {}
        for target in self._targets.values():
            if not target.ready:
                continue
            nodes = set(target.nodes)
            if target.extra_nodes is not None:
                try:
                    nodes |= set(target.extra_nodes())
                except Exception as e:  # noqa: BLE001
                    self._warner.warn(f"extra-nodes:{type(e).__name__}", f"could not read more nodes ({describe(e)})")
            for node_id in select_nodes(target.selection, nodes, alive, target.covered_node):
                wanted.setdefault(node_id, {})[target.run_id] = target
        return wanted

    def _reconcile(self) -> None:
        import ray

        if not self._targets and not self._loggers:
            return
        alive = alive_nodes(ray.nodes())
        wanted = self._wanted(alive)
        # Loggers on dead nodes: nothing to finish there, only clean up.
        with self._lock:
            dead = [lg for nid, lg in self._loggers.items() if nid not in alive]
            for lg in dead:
                del self._loggers[lg.node.node_id]
        for lg in dead:
            self._kill(lg)
            self._record_lost(lg)
        # Writers of runs that no longer use a node finish (the actor stays for other runs).
        for node_id, lg in list(self._loggers.items()):
            for run_id in sorted(lg.runs - set(wanted.get(node_id, {}))):
                lg.runs.discard(run_id)
                lg.actor.finish.remote(run_id, None)
        # New nodes get a logger; every wanted (node, run) pair gets a writer.
        new_nodes = [alive[nid] for nid in sorted(wanted) if nid not in self._loggers]
        if new_nodes:
            self._start_loggers(new_nodes)
        now = time.monotonic()
        for node_id, runs in wanted.items():
            host = self._loggers.get(node_id)
            if host is None:
                continue
            for run_id, target in runs.items():
                if run_id not in host.runs and node_id not in self._collecting.get(run_id, ()):
                    host.runs.add(run_id)
                    if target.index is not None:  # offline: collected from here at the end
                        self._hosted.setdefault(node_id, set()).add(run_id)
                    ref = host.actor.add_writer.remote(target.spec(host.node))
                    self._joins.append(_Join(logger=host, run_id=run_id, ref=ref, started=now))
                    for row in self._pending_rows.pop(run_id, []):
                        host.actor.log.remote(run_id, row)

    def _check_health(self) -> None:
        """Ping each logger; one that restarted (its process died) gets its writers back.

        Logger actors restart where their bundle is (``max_restarts=-1``) with no writers;
        each rejoins its run with the same label. One that is gone for good is replaced.
        """
        import ray

        now = time.monotonic()
        for lg in list(self._loggers.values()):
            if lg.ping is None:
                if lg.runs and now - lg.pinged >= self._poll_s:
                    lg.ping, lg.pinged = lg.actor.status.remote(), now
                continue
            if not ray.wait([lg.ping], timeout=0)[0]:
                continue
            ref, lg.ping = lg.ping, None
            try:
                status = ray.get(ref, timeout=0)
            except Exception as e:  # noqa: BLE001 - the actor is gone and will not restart
                self._warner.warn(
                    f"node-lost:{lg.node.node_id}",
                    f"the node logger on {lg.node.label} stopped ({describe(e)}); starting another",
                )
                with self._lock:
                    self._loggers.pop(lg.node.node_id, None)
                self._kill(lg)
                continue
            # A new pid, or Ray's own count: a call in flight when the process died is retried
            # on the new one, so the first status seen may already come from it.
            restarted = (lg.pid is not None and status.get("pid") != lg.pid) or bool(status.get("restarted"))
            lg.pid = status.get("pid")
            missing = lg.runs - set(status.get("runs", ())) - set(status.get("errors", {}))
            if restarted or missing:
                self._warner.warn(
                    f"node-restart:{lg.node.node_id}:{lg.pid}",
                    f"the node logger on {lg.node.label} restarted; its writers rejoin their runs with the same label",
                )
            for run_id in sorted(missing):
                target = self._targets.get(run_id)
                if target is None:
                    lg.runs.discard(run_id)
                    continue
                ref = lg.actor.add_writer.remote(target.spec(lg.node))
                self._joins.append(_Join(logger=lg, run_id=run_id, ref=ref, started=now))

    def _route(self, run_id: str, metrics: dict[str, Any]) -> None:
        target = self._targets.get(run_id)
        if target is None:
            return
        row, skipped = to_row(metrics, target.excludes)
        warn_skipped(self._warner, skipped)
        host = next((lg for lg in self._loggers.values() if run_id in lg.runs), None)
        if host is not None:
            host.actor.log.remote(run_id, row)
            return
        pending = self._pending_rows.setdefault(run_id, [])
        if len(pending) < _MAX_PENDING_ROWS:
            pending.append(row)
        else:
            self._warner.warn(
                f"pending:{run_id}", f"the W&B run {run_id} has no writer yet; rows beyond {_MAX_PENDING_ROWS} dropped"
            )

    def _start_loggers(self, nodes: list[NodeInfo]) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._actor_cls is None:
            self._actor_cls = _logger_actor_class()
        key = next(self._group_ids)
        pg = placement_group(
            [dict(BUNDLE) for _ in nodes],
            strategy="STRICT_SPREAD",
            bundle_label_selector=[{NODE_ID_LABEL: n.node_id} for n in nodes],
            name=f"{self._pg_prefix()}{key}",
        )
        group = _Group(pg=pg, nodes={n.node_id for n in nodes})
        with self._lock:
            self._groups[key] = group
        self._guard(pg)
        for index, node in enumerate(nodes):
            actor = self._actor_cls.options(
                num_cpus=0,
                # A killed logger process comes back in its bundle; calls in flight are retried.
                max_restarts=-1,
                max_task_retries=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=index
                ),
            ).remote()
            with self._lock:
                self._loggers[node.node_id] = _Logger(node=node, actor=actor, pg_key=key)

    def _pg_prefix(self) -> str:
        import ray

        from ._janitor import group_prefix

        owner = ray.get_runtime_context().get_actor_id()
        return group_prefix(owner) if owner else f"{PG_NAME_PREFIX}:driver:"

    def _guard(self, pg: Any) -> None:
        """Inside an actor (the Train controller), start the detached janitor that removes the
        fleet's placement groups should the actor die; a driver's groups end with its job."""
        import ray

        owner = ray.get_runtime_context().get_actor_id()
        if owner is None or self._janitor is not None:
            return
        try:
            from ._janitor import LoggerJanitor

            self._janitor = (
                ray.remote(LoggerJanitor)
                .options(num_cpus=0, lifetime="detached", max_concurrency=2, namespace=PG_NAME_PREFIX)
                .remote(owner)
            )
        except Exception as e:  # noqa: BLE001
            self._warner.warn("janitor", f"placement groups may outlive a crashed controller ({describe(e)})")

    def _check_joins(self) -> None:
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
                self._report(join.logger, join.ref, join.run_id)
            elif now - join.started > self._init_timeout_s + _JOIN_GRACE_S:
                self._warner.warn(
                    f"join-timeout:{join.logger.node.node_id}:{join.run_id}",
                    f"the node writer on {join.logger.node.label} has not joined the W&B run {join.run_id} after "
                    f"{now - join.started:.0f}s; that node's system metrics may be missing",
                )
            else:
                still.append(join)
        self._joins = still

    def _report(self, lg: _Logger, ref: Any, run_id: str | None = None) -> None:
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
        if lg.pid is None:
            lg.pid = status.get("pid")
        for rid, error in status.get("errors", {}).items():
            if run_id is None or rid == run_id:
                self._warner.warn(
                    f"node-init:{lg.node.node_id}:{rid}",
                    f"the node writer on {lg.node.label} could not join the W&B run {rid}; "
                    f"that node's system metrics are missing ({error})",
                )

    # retiring runs ---------------------------------------------------------------------------
    def _start_retirement(
        self, run_id: str, timeout: float, then: Callable[[], None] | None, exit_code: int | None = None
    ) -> None:
        target = self._targets.pop(run_id, None)
        if target is not None and target.standalone is not None and self._pending_rows.get(run_id):
            # Rows that never found their writer: place it now, so they are not lost.
            self._targets[run_id] = target
            self._reconcile()
            self._targets.pop(run_id, None)
        self._pending_rows.pop(run_id, None)
        refs: dict[Any, _Logger] = {}
        for lg in self._loggers.values():
            if run_id in lg.runs:
                lg.runs.discard(run_id)
                refs[lg.actor.finish.remote(run_id, exit_code)] = lg
        retirement = _Retirement(
            run_id=run_id, refs=refs, deadline=time.monotonic() + timeout, timeout=timeout, then=then
        )
        if target is not None and target.index is not None:
            retirement.index = target.index
            retirement.storage = target.storage
            retirement.sources = [lg for nid, lg in self._loggers.items() if run_id in self._hosted.get(nid, ())]
            retirement.role = target.role
            try:
                target.index.update(worker_nodes=sorted(target.nodes))
            except OSError as e:
                self._warner.warn("offline-index", f"the offline index could not be written ({describe(e)})")
        self._retirements.append(retirement)

    def _check_retirements(self, final: bool = False) -> None:
        still: list[_Retirement] = []
        for r in self._retirements:
            try:
                if self._advance(r, final):
                    still.append(r)
            except Exception as e:  # noqa: BLE001 - one run's end must not hold the others'
                self._warner.warn(f"retire:{r.run_id}", f"ending the W&B run {r.run_id} failed ({describe(e)})")
        self._retirements = still

    def _advance(self, r: _Retirement, final: bool) -> bool:
        """One step of a run's end; True while it has more to do."""
        import ray

        if r.collectors is not None:  # writers finished; their offline runs are on their way
            if any(t.is_alive() for t in r.collectors) and time.monotonic() < r.collect_deadline and not final:
                return True
            self._end_collection(r)
            return False
        pending = list(r.refs)
        done, not_done = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        if not_done and time.monotonic() < r.deadline and not final:
            return True
        for ref in done:
            self._report(r.refs[ref], ref, r.run_id)
        if not_done:
            labels = ", ".join(sorted(r.refs[ref].node.label for ref in not_done))
            self._warner.warn(
                f"node-finish-timeout:{r.run_id}",
                f"node writer(s) {labels} of the W&B run {r.run_id} did not finish within {r.timeout:.0f}s; "
                "their last samples may be missing",
            )
        try:
            if r.then is not None:
                r.then()
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"retire:{r.run_id}", f"finishing the W&B run {r.run_id} failed ({describe(e)})")
        if r.index is not None and r.sources:
            if final:
                self._end_collection(r)
            else:
                self._start_collection(r)
                return True
        return False

    # offline runs ----------------------------------------------------------------------------
    def _start_collection(self, r: _Retirement) -> None:
        """Bring each node writer's offline run to the run's folder, in parallel, bounded."""
        r.collect_deadline = time.monotonic() + r.timeout
        self._collecting.setdefault(r.run_id, set()).update(lg.node.node_id for lg in r.sources)
        r.collectors = [
            threading.Thread(
                target=self._collect,
                args=(lg, r.run_id, r.index, r.role, r.collect_deadline, r.recorded, r.storage),
                name=f"ray_wandb_nodes-collect-{lg.node.label}",
                daemon=True,
            )
            for lg in r.sources
        ]
        for t in r.collectors:
            t.start()

    def _end_collection(self, r: _Retirement) -> None:
        """Name, in the index, every node whose offline run was not brought over in time."""
        assert r.index is not None
        for lg in r.sources:
            if lg.node.label not in r.recorded:
                self._leave_on_node(
                    lg, r.run_id, r.index, r.role, "the run ended before its offline run was brought over"
                )
        for lg in r.sources:
            self._hosted.get(lg.node.node_id, set()).discard(r.run_id)
            self._collecting.get(r.run_id, set()).discard(lg.node.node_id)
        if not self._collecting.get(r.run_id):
            self._collecting.pop(r.run_id, None)
        if r.storage is not None and not any(t.is_alive() for t in r.collectors or ()):
            remove_folder_if_empty(r.storage)

    def _leave_on_node(
        self, lg: _Logger, run_id: str, index: OfflineIndex, role: str, error: str, state: str = "left-on-node"
    ) -> None:
        """Say, in a warning and in the index, that a node's offline run is not in the folder,
        why, and (unless it is empty) where it stayed."""
        node = lg.node
        fields: dict[str, Any] = {"state": state, "error": error}
        if state != "empty":
            fields["source"] = f"{node.hostname}:{node_local_dir(run_id, node.label)}"
        where = f"; it is at {fields['source']}" if "source" in fields else ""
        self._warner.warn(
            f"offline:{run_id}:{node.node_id}",
            f"the offline run of {node.label} was not brought to {index.folder} ({error}){where}",
        )
        self._set_writer(index, node, role, **fields)

    def _set_writer(self, index: OfflineIndex, node: NodeInfo, role: str, **fields: Any) -> None:
        entry = {"role": role, "label": node.label, "node_id": node.node_id, "hostname": node.hostname, **fields}
        try:
            index.set_writer(entry)
        except OSError as e:
            self._warner.warn("offline-index", f"the offline index could not be written ({describe(e)})")

    def _collect(
        self,
        lg: _Logger,
        run_id: str,
        index: OfflineIndex,
        role: str,
        deadline: float,
        recorded: set[str],
        storage: StorageSpot | None = None,
    ) -> None:
        """Bring one node's offline run over: through ``storage`` when given (no size bound; a
        node or driver side that cannot use it falls back to Ray), else through Ray."""
        import os

        import ray

        node = lg.node

        def left() -> float:
            return _left(deadline)

        dest = os.path.join(index.folder, "nodes", node.label)
        try:
            limit = None if storage is not None else MAX_COLLECT_BYTES
            info = ray.get(lg.actor.pack_offline.remote(run_id, node.label, limit), timeout=left())
            if not info["bytes"]:
                self._leave_on_node(lg, run_id, index, role, "the node writer left no offline data", state="empty")
                return
            via = "ray"
            if storage is not None and self._through_storage(lg, run_id, storage, info, dest, deadline):
                via = "storage"
            if via == "ray":
                if info["bytes"] > MAX_COLLECT_BYTES:
                    if info["archive"] is not None:
                        lg.actor.drop_archive.remote(info["archive"])
                    error = f"{info['bytes']} bytes packed, above the {MAX_COLLECT_BYTES} bytes brought through Ray"
                    self._leave_on_node(lg, run_id, index, role, error)
                    return
                receive(
                    lambda offset: ray.get(lg.actor.read_offline.remote(info["archive"], offset), timeout=left()),
                    info["bytes"],
                    dest,
                    deadline,
                )
        except Exception as e:  # noqa: BLE001 - the data stays on the node; say where
            self._leave_on_node(lg, run_id, index, role, describe(e))
            return
        finally:
            recorded.add(node.label)
        self._set_writer(index, node, role, state="collected", via=via, path=index.relative(dest), bytes=info["bytes"])
        try:
            ray.get(lg.actor.discard_offline.remote(run_id, node.label), timeout=left())
        except Exception as e:  # noqa: BLE001 - collected; only the node's copy stays
            self._warner.warn(
                f"offline-discard:{run_id}:{node.node_id}",
                f"the offline run of {node.label} was brought over, but its copy on the node could not be removed "
                f"({describe(e)})",
            )

    def _through_storage(
        self, lg: _Logger, run_id: str, storage: StorageSpot, info: dict[str, Any], dest: str, deadline: float
    ) -> bool:
        """The node copies its archive into the storage and the driver side fetches it: True.

        False to go through Ray instead (the node could not write there, or the driver side
        could not read what it wrote: a path that is not shared); raises once the deadline has
        passed, as nothing is left for Ray then. No copy stays in the storage either way.
        """
        import ray

        node = lg.node

        def left() -> float:
            return _left(deadline)

        written = False
        try:
            until = time.time() + left()  # wall clock: the node checks it on its own machine
            ray.get(lg.actor.put_offline.remote(info["archive"], storage, node.label, until), timeout=left())
            written = True
            fetch(storage, node.label, info["bytes"], dest, deadline)
            return True
        except Exception as e:
            if written:  # what the node wrote is where the driver side does not look: the node removes it
                try:
                    ray.get(lg.actor.remove_stored.remote(storage, node.label), timeout=max(left(), 5.0))
                except Exception:  # noqa: BLE001
                    pass
            if time.monotonic() >= deadline:
                raise
            self._warner.warn(
                f"offline-storage:{run_id}:{node.node_id}",
                f"the offline run of {node.label} could not be brought through {storage.uri} "
                f"({describe(e)}); through Ray instead",
            )
            return False
        finally:
            remove(storage, node.label)

    def _record_lost(self, lg: _Logger) -> None:
        for run_id in sorted(self._hosted.get(lg.node.node_id, ())):
            target = self._targets.get(run_id)
            if target is not None and target.index is not None:
                error = "the node left the cluster; its offline run stayed on it"
                self._leave_on_node(lg, run_id, target.index, target.role, error, state="lost")

    def _shutdown(self, timeout: float) -> None:
        """Retire the runs still open (their primaries finish as failed: nobody said otherwise)."""
        for run_id, target in list(self._targets.items()):
            then = functools.partial(target.primary.request_finish, 1) if target.primary is not None else None
            self._start_retirement(run_id, timeout, then, exit_code=1)
        deadline = time.monotonic() + timeout
        while self._retirements and time.monotonic() < deadline:
            self._check_retirements()
            if self._retirements:
                time.sleep(0.1)
        self._check_retirements(final=True)

    # cleanup ---------------------------------------------------------------------------------
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
        if self._janitor is not None:
            try:
                self._janitor.stop.remote()
            except Exception:  # noqa: BLE001
                pass
            self._janitor = None
