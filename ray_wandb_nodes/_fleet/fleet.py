"""The node fleet: writers on the nodes each W&B run uses, kept in step on one thread.

Hooks only hand the fleet commands (a queue; nothing blocks). Its one thread holds the *run
targets* (for each W&B run, the nodes it uses), re-reads the alive nodes every few seconds,
asks :func:`~.plan.plan` what to do, and carries it out through the logger pool (one
``NodeLogger`` actor per node, serving every run on that node, so the cost grows with nodes,
not runs times nodes). At a run's end it retires the run's writers (bounded), hands the run's
end to whoever owns it, and brings offline runs over through the offline collection.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import _ray
from .._warn import Warner, describe
from .._writers import WriterSpec
from .actors import RayActors
from .collect import OfflineCollection
from .health import FleetHealth, rank_report, stragglers
from .nodes import NodeInfo, alive_nodes, candidate_nodes, prestart_nodes
from .plan import plan, run_of
from .pool import LoggerPool
from .ready import Awaits
from .retire import Retirement, advance_all, retire
from .rows import RowRouter
from .targets import RunTarget, SharedTarget, StandaloneTarget, early_nodes, extra_nodes, writer_spec

POLL_S = 3.0
_BUSY_POLL_S = 0.2  # while runs are being retired
_RELAY_POLL_S = 1.0  # while a run learns its nodes from elsewhere (a Train run inside a trial)
_AWAIT_POLL_S = 0.05  # while a worker group's start waits for its node writers
LISTING_NODES = 1000  # past this many nodes, the node listing slows down in proportion


def _wait_s(poll_s: float, *, awaiting: bool, retiring: bool, relay: bool) -> float:
    """How long the fleet thread waits for a command before a poll."""
    if awaiting:
        return _AWAIT_POLL_S
    if retiring:
        return _BUSY_POLL_S
    return min(poll_s, _RELAY_POLL_S) if relay else poll_s


class NodeFleet:
    def __init__(
        self,
        *,
        init_timeout_s: float,
        warner: Warner,
        poll_s: float = POLL_S,
        list_nodes: Callable[[], list[dict[str, Any]]] = _ray.list_nodes,
        actors: RayActors | None = None,
        clock: Callable[[], float] = time.monotonic,
        free_resources: Callable[[], dict[str, dict[str, float]]] = _ray.free_resources,
    ) -> None:
        """``list_nodes``, ``actors``, ``clock``, ``free_resources``: Ray's and time's;
        ``bench/fleet_scale.py`` simulates them."""
        self._warner = warner
        self._poll_s = poll_s
        self._list_nodes = list_nodes
        self._free_resources = free_resources
        self._clock = clock
        self._listed_at: float | None = None
        self._dirty = True  # something the plan reads changed since it last ran
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._targets: dict[str, RunTarget] = {}
        self._retirements: list[Retirement] = []
        self._rows = RowRouter(warner)  # a standalone run's rows
        self._awaits = Awaits()  # worker-group starts waiting for their node writers
        self._pool = LoggerPool(init_timeout_s=init_timeout_s, warner=warner, ping_s=poll_s, actors=actors, clock=clock)
        self._health = FleetHealth(warner)
        self._collection = OfflineCollection(warner)
        self._alive: dict[str, NodeInfo] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-fleet", daemon=True)

    # called from hooks and writer threads: never blocks -----------------------------------------
    def start(self) -> None:
        if not self._thread.ident:
            self._thread.start()

    def add_run(self, target: RunTarget) -> None:
        self._commands.put(("add", target))

    def run_ready(self, target: RunTarget) -> None:
        """``target``'s run exists (its primary created it): its node writers may join."""
        self._commands.put(("ready", target))

    def set_run_nodes(
        self,
        run_id: str,
        nodes: Iterable[str],
        covered_node: str | None = None,
        target: RunTarget | None = None,
        ranks: dict[str, tuple[int, ...]] | None = None,
        rank_gpus: dict[int, tuple[str, ...]] | None = None,
    ) -> None:
        """The nodes a run uses now (replaces the previous set), and the primary's own node;
        with ``target``, only while that target is the run's (not a later one of the same id);
        ``ranks``: the train ranks on each node, when known; ``rank_gpus``: each rank's GPU ids."""
        self._commands.put(("nodes", (run_id, set(nodes), covered_node, target, ranks, rank_gpus)))

    def prestart(
        self,
        *,
        use_gpu: bool,
        exclude: str | None,
        workers: int | None = None,
        per_worker: dict[str, float] | None = None,
    ) -> None:
        """Start loggers now on the nodes the job's ``workers`` (each asking ``per_worker``) can
        use, at most as many as it needs (see nodes.prestart_nodes and pool.prestart)."""
        self._commands.put(("prestart", (use_gpu, exclude, workers, per_worker)))

    def rank_report(self, run_id: str, metrics: list[dict[str, Any]]) -> None:
        """Every rank's report, for the run's straggler rule by metric."""
        self._commands.put(("ranks", (run_id, metrics, time.time())))

    def await_writers(self, run_ids: Iterable[str], timeout: float) -> bool:
        """Wait (at most ``timeout``) until every node writer the runs want has joined and taken
        its first sample; at once for a run not created yet. False when the time ran out."""
        if self._stopped.is_set() or not self._thread.ident:  # no fleet thread: nothing will join
            return True
        done = threading.Event()
        self._commands.put(("await", (list(run_ids), done)))
        return done.wait(timeout)

    def log_artifact(self, run_id: str, checkpoint: Any, name: str, aliases: list[str]) -> None:
        """A checkpoint artifact for a standalone run, logged by the actor hosting it."""
        self._commands.put(("artifact", (run_id, checkpoint, name, aliases)))

    def log(self, run_id: str, metrics: dict[str, Any]) -> None:
        """A history row for a standalone run, delivered to the actor hosting it (in order)."""
        self._commands.put(("log", (run_id, metrics)))

    def retire_run(
        self, run_id: str, timeout: float, then: Callable[[], None] | None = None, exit_code: int | None = None
    ) -> threading.Event:
        """Finish the run's writers (bounded by ``timeout``), then call ``then``; the event is set
        after that (or at once should the fleet be gone).

        ``then`` finishes the primary: node writers end first so that no late write reopens a
        run whose final state the primary has sent. A standalone run's writer finishes with
        ``exit_code``; a joining writer never sends the run's state.
        """
        done = threading.Event()
        if self._stopped.is_set():
            done.set()
        self._commands.put(("retire", (run_id, timeout, then, exit_code, done)))
        return done

    def shutdown(self, timeout: float, slack_s: float = 10.0) -> None:
        """Retire the node writers of every run still open, then kill every actor and placement
        group (bounded: ``timeout``, and ``slack_s`` more for a fleet thread inside a Ray call).
        A primary is its session's to finish, never the fleet's."""
        if self._thread.ident:
            self._commands.put(("shutdown", timeout))
            if not self._stopped.wait(timeout + slack_s):
                self._warner.warn("fleet:stuck", "node loggers did not stop in time; killing them")
        self._pool.kill_all()

    # the fleet thread ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while True:
                relay = any(isinstance(t, SharedTarget) and t.extra_nodes for t in self._targets.values())
                wait = _wait_s(self._poll_s, awaiting=bool(self._awaits), retiring=bool(self._retirements), relay=relay)
                try:
                    kind, payload = self._commands.get(timeout=wait)
                except queue.Empty:
                    kind, payload = "poll", None
                if kind == "shutdown":
                    self._shutdown(payload)
                    return
                self._dirty |= relay and kind == "poll"  # a relay's nodes are read, not told
                self.step(kind, payload)
        finally:
            self._stopped.set()
            self._awaits.release_all()
            for r in self._retirements:
                r.writers_done.set()

    def step(self, kind: str, payload: Any) -> None:
        """One turn of the fleet thread: a command (or ``"poll"``), then what is due; its work grows
        with what changed (listing once a poll, plan on change, pings and summaries batched)."""
        try:
            self._apply(kind, payload)
            self._refresh_nodes()
            self._pool.check_joins()
            self._pool.check_health(self._spec_for)
            if self._pool.changed:
                self._pool.changed, self._dirty = False, True
            if self._dirty:
                self._dirty = False
                self._carry_out_plan()
            self._check_health()
            self._awaits.check(self._targets, self._pool, self._alive)
            self._check_retirements()
        except Exception as e:  # noqa: BLE001 - the fleet must outlive any one failure
            self._warner.warn(f"fleet:{type(e).__name__}", f"node loggers could not be updated ({describe(e)})")

    def _refresh_nodes(self) -> None:
        """Re-read the alive nodes (one GCS call) once a poll, past 1,000 nodes once per poll and
        1,000 nodes (5,000: every 15 s); a change re-plans. Between listings a lost node shows as
        its logger's failed ping, and Train's worker-group hooks tell the nodes a run uses."""
        now = self._clock()
        every = self._poll_s * max(1.0, len(self._alive) / LISTING_NODES)
        if (not self._targets and not self._pool) or (self._listed_at is not None and now - self._listed_at < every):
            return
        self._listed_at = now
        alive = alive_nodes(self._list_nodes(), self._alive)
        if alive.keys() != self._alive.keys():  # else the same object stays: nothing downstream redoes work
            self._dirty = True
            self._alive = alive

    def _apply(self, kind: str, payload: Any) -> None:
        self._dirty |= kind in ("add", "ready", "nodes", "retire")
        if kind == "add":
            self._targets[payload.run_id] = payload
        elif kind == "ready":
            ready: RunTarget = payload
            if self._targets.get(ready.run_id) is ready:
                ready.ready = True
        elif kind == "nodes":
            run_id, nodes, covered, only, ranks, rank_gpus = payload
            target = self._targets.get(run_id)
            if target is not None and (only is None or only is target):
                target.nodes, target.covered_node = nodes, covered
                if ranks is not None:
                    target.ranks = ranks
                if rank_gpus is not None:
                    target.rank_gpus = rank_gpus
        elif kind == "ranks":  # (run id, every rank's report, when)
            rank_report(self._targets.get(payload[0]), *payload[1:])
        elif kind == "retire":
            self._start_retirement(*payload)
        elif kind == "await":
            self._awaits.add(*payload)
        elif kind == "prestart":
            self._refresh_nodes()
            self._pool.prestart(self._prestart_nodes(*payload))
        elif kind in ("log", "artifact"):  # a standalone run's row or checkpoint, to its writer's logger
            target = self._targets.get(payload[0])
            if isinstance(target, StandaloneTarget):
                self._rows.deliver(kind, target, payload, self._pool.host_of(target.run_id))

    def _prestart_nodes(
        self, use_gpu: bool, exclude: str | None, workers: int | None, per_worker: dict[str, float] | None
    ) -> list[NodeInfo]:
        """The nodes to start loggers on ahead: where the job's workers fit now (each node's free
        resources, its totals when those cannot be read), no more nodes than the job needs."""
        if workers is None or workers < 1:  # unknown: every node that could host a worker
            return candidate_nodes(self._alive, use_gpu=use_gpu, exclude=exclude)
        free = self._free_resources() or {n: {"CPU": i.cpus, "GPU": i.gpus} for n, i in self._alive.items()}
        asks = per_worker or ({"GPU": 1.0} if use_gpu else {"CPU": 1.0})
        return prestart_nodes(self._alive, free, workers=workers, per_worker=asks, exclude=exclude)

    def _spec_for(self, key: str, node: NodeInfo) -> WriterSpec | None:  # of writer `key` on `node`
        return writer_spec(self._targets, key, node)

    def _carry_out_plan(self) -> None:
        if not self._targets and not self._pool:
            return
        alive = self._alive
        kinds = {n: i.kind for n, i in alive.items()}
        wants = [t.wants(extra_nodes(t, self._warner), kinds, stragglers(t)) for t in self._targets.values() if t.ready]
        step = plan(self._pool.runs_by_node(), wants, alive, self._collection.collecting)
        offline = {rid: (t.index, t.role) for rid, t in self._targets.items() if t.index is not None}
        for node_id in step.lost:
            handle = self._pool.drop(node_id)
            if handle is not None:
                self._collection.lost(handle.node, offline)
        for node_id, key in step.finish:
            self._pool.finish_writer(node_id, key)
        if step.start:
            self._pool.start([alive[node_id] for node_id in step.start])
        for node_id, key in step.add:
            spec = self._spec_for(key, alive[node_id])
            if spec is None:
                continue
            host = self._pool.add_writer(node_id, spec)
            target = self._targets[run_of(key)[0]]
            if target.index is not None and spec.role != "observer":  # offline: collected from here at the end
                self._collection.hosted(node_id, key)
            self._rows.placed(key, host)
        self._health.note_caps(step.capped, self._targets)
        early = early_nodes(self._targets.values(), alive)  # their loggers start before the run exists
        self._pool.prestart([alive[n] for n in sorted(early)])
        if wants and all(w.selection == "workers" for w in wants) and any(w.nodes for w in wants):
            self._pool.drop_unused_warm(early.union(*(w.nodes for w in wants)))

    def _check_health(self, only: str | None = None, final: bool = False) -> None:
        """Feed each shared run's node health (what changed) and publish what it says (``only``: one run)."""
        self._dirty |= self._health.check(self._targets, self._pool, self._alive, only=only, final=final)

    # retiring runs ---------------------------------------------------------------------------
    def _start_retirement(self, run_id: str, *how: Any) -> None:
        """``how``: (timeout, then, exit code, the event to set once the writers are done)."""
        target = self._targets.get(run_id)
        if target is not None and self._rows.waiting(run_id):
            self._carry_out_plan()  # rows that never found their writer: place it now, so they are not lost
        if target is not None:
            self._check_health(only=run_id, final=True)  # the last node table, before the primary ends
        self._targets.pop(run_id, None)
        self._rows.drop(run_id)
        self._health.forget(run_id)
        retirement = retire(run_id, target, self._pool, self._collection, self._warner, how)
        self._retirements.append(retirement)
        retirement.wake_on_each_finish(lambda: self._commands.put(("wake", None)))  # no poll's wait

    def _check_retirements(self, final: bool = False) -> None:  # one step of every run's end
        self._retirements = advance_all(self._retirements, self._pool, self._collection, self._warner, final)

    def _shutdown(self, timeout: float) -> None:
        """Retire the runs still open (their writers only: each primary is its session's)."""
        for run_id in list(self._targets):
            self._start_retirement(run_id, timeout, None, 1, threading.Event())
        deadline = time.monotonic() + timeout
        while self._retirements and time.monotonic() < deadline:
            self._check_retirements()
            if self._retirements:
                time.sleep(0.1)
        self._check_retirements(final=True)
