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
from typing import TYPE_CHECKING, Any

from .. import _ray
from .._gpu_ids import RankGpus
from .._warn import Warner
from . import commands as cmd
from .actors import RayActors
from .egress import RelayPlan
from .listing import LISTING_NODES
from .targets import RunProcess, RunTarget
from .worker import FleetWorker

if TYPE_CHECKING:
    from .._failure import FailedAttempt

__all__ = ["LISTING_NODES", "POLL_S", "NodeFleet", "RelayPlan"]

POLL_S = 3.0
_BUSY_POLL_S = 0.2  # while runs are being retired
_RELAY_POLL_S = 1.0  # while a run learns its nodes from elsewhere (a Train run inside a trial)
_AWAIT_POLL_S = 0.05  # while a worker group's start waits for its node writers


def _wait_s(poll_s: float, *, awaiting: bool, retiring: bool, relay: bool, egress: bool = False) -> float:
    """How long the fleet thread waits for a command before a poll (``egress``: writers wait for
    the run's relay to listen)."""
    if awaiting:
        return _AWAIT_POLL_S
    if retiring or egress:
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
        relay: RelayPlan | None = None,
    ) -> None:
        """``list_nodes``, ``actors``, ``clock``, ``free_resources``: Ray's and time's;
        ``bench/fleet_scale.py`` simulates them. ``relay``: the runs' nodes without a route to
        W&B send through a relay on this node (started with the fleet's thread, stopped with it)."""
        self._warner = warner
        self._poll_s = poll_s
        self._commands: queue.SimpleQueue[cmd.Command] = queue.SimpleQueue()
        self.worker = FleetWorker(
            init_timeout_s=init_timeout_s,
            warner=warner,
            poll_s=poll_s,
            list_nodes=list_nodes,
            actors=actors,
            clock=clock,
            free_resources=free_resources,
            wake=lambda: self._commands.put(cmd.Poll()),
            relay=relay,
        )
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-fleet", daemon=True)

    # called from hooks and writer threads: never blocks -----------------------------------------
    def start(self) -> None:
        if not self._thread.ident:
            self._thread.start()

    def add_run(self, target: RunTarget) -> None:
        self._commands.put(cmd.AddRun(target))

    def run_ready(self, target: RunTarget) -> None:
        """``target``'s run exists (its primary created it): its node writers may join."""
        self._commands.put(cmd.RunReady(target))

    def set_run_nodes(
        self,
        run_id: str,
        nodes: Iterable[str],
        covered_node: str | None = None,
        target: RunTarget | None = None,
        ranks: dict[str, tuple[int, ...]] | None = None,
        rank_gpus: dict[int, RankGpus] | None = None,
        attempt: str | None = None,
        pids: dict[int, int] | None = None,
    ) -> None:
        """The nodes a run uses now (replaces the previous set), and the primary's own node;
        with ``target``, only while that target is the run's (not a later one of the same id);
        ``ranks``: the train ranks on each node, when known; ``rank_gpus``: each rank's GPU ids;
        ``attempt``: the key of the ranks' attempt (their folder on each node), when armed;
        ``pids``: each rank's process id (its console's files), when known."""
        self._commands.put(cmd.SetNodes(run_id, set(nodes), covered_node, target, ranks, rank_gpus, attempt, pids))

    def attempt_ended(self, run_id: str, failed: bool) -> None:
        """The run's attempt ended (its worker group shuts down), ``failed`` or not: its ranks' console ends."""
        self._commands.put(cmd.AttemptEnded(run_id, failed))

    def located(self, run_id: str, process: RunProcess, target: RunTarget | None = None) -> None:
        """The run's own process and its node (a Tune trial's): the node writer there reports its
        ``proc.*`` series; with ``target``, only while that target is the run's."""
        self._commands.put(cmd.Located(run_id, process, target))

    def end_health(self, run_id: str) -> None:
        """An abort: the run's node health ends now, without its last tables."""
        self._commands.put(cmd.EndHealth(run_id))

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
        self._commands.put(cmd.Prestart(use_gpu, exclude, workers, per_worker))

    def rank_report(
        self, run_id: str, metrics: list[dict[str, Any]], checkpoint: bool = False, at: float | None = None
    ) -> None:
        """Every rank's report (for the run's straggler rule by metric), with a checkpoint or not,
        made ``at`` (epoch seconds; now when not given)."""
        self._commands.put(cmd.RankReport(run_id, metrics, time.time() if at is None else at, checkpoint))

    def ranks_finished(self, run_id: str, ranks: frozenset[int]) -> None:
        """The run's ranks whose train function returned (Train's poll), for its hang watch."""
        self._commands.put(cmd.RanksFinished(run_id, ranks))

    def checkpointed(self, run_id: str, reports: int) -> None:
        """The run's attempt reported a checkpoint with its ``reports``-th report (0: it started)."""
        self._commands.put(cmd.Checkpointed(run_id, reports))

    def attempt_failed(self, run_id: str, failed: FailedAttempt) -> None:
        """The run's attempt failed: its failure is named in the run (decided on the fleet thread)."""
        self._commands.put(cmd.AttemptFailed(run_id, failed))

    def attempt_recovered(self, run_id: str, attempt: int) -> None:
        """The run's ``attempt`` reported after an earlier one failed."""
        self._commands.put(cmd.AttemptRecovered(run_id, attempt))

    def await_writers(self, run_ids: Iterable[str], timeout: float) -> bool:
        """Wait (at most ``timeout``) until every node writer the runs want has joined and taken
        its first sample; at once for a run not created yet. False when the time ran out."""
        if self._stopped.is_set() or not self._thread.ident:  # no fleet thread: nothing will join
            return True
        done = threading.Event()
        self._commands.put(cmd.AwaitWriters(list(run_ids), done))
        return done.wait(timeout)

    def log_artifact(self, run_id: str, checkpoint: Any, name: str, aliases: list[str]) -> None:
        """A checkpoint artifact for a standalone run, logged by the actor hosting it."""
        self._commands.put(cmd.LogArtifact(run_id, checkpoint, name, aliases))

    def log(self, run_id: str, metrics: dict[str, Any]) -> None:
        """A history row for a standalone run, delivered to the actor hosting it (in order)."""
        self._commands.put(cmd.LogRow(run_id, metrics))

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
        self._commands.put(cmd.Retire(run_id, timeout, then, exit_code, done))
        return done

    def shutdown(self, timeout: float, slack_s: float = 10.0) -> None:
        """Retire the node writers of every run still open, then kill every actor and placement
        group (bounded: ``timeout``, and ``slack_s`` more for a fleet thread inside a Ray call).
        A primary is its session's to finish, never the fleet's."""
        if self._thread.ident:
            self._commands.put(cmd.Shutdown(timeout))
            if not self._stopped.wait(timeout + slack_s):
                self._warner.warn("fleet:stuck", "node loggers did not stop in time; killing them")
        self.worker.pool.kill_all()
        self.worker.egress.stop(0.0)  # the relay's actor, should the fleet thread not have stopped it

    # the fleet thread ------------------------------------------------------------------------
    def _main(self) -> None:
        w = self.worker
        try:
            w.egress.start()  # the relay, when the runs want one: its actor starts as the run's primary does
            while True:
                relay = w.relaying
                busy = bool(w.retirements) or w.failing  # a run's end, or a failure's facts awaited
                wait = _wait_s(
                    self._poll_s, awaiting=bool(w.awaits), retiring=busy, relay=relay, egress=w.egress.holding
                )
                try:
                    command: cmd.Command = self._commands.get(timeout=wait)
                except queue.Empty:
                    command = cmd.Poll()
                if isinstance(command, cmd.Shutdown):
                    w.shutdown(command.timeout)
                    return
                w.dirty |= relay and isinstance(command, cmd.Poll)  # a relay's nodes are read, not told
                w.step(command)
        finally:
            self._stopped.set()
            w.release()

    def step(self, command: cmd.Command) -> None:
        """One turn of the fleet thread (``FleetWorker.step``); the benchmarks drive it so."""
        self.worker.step(command)
