"""The fleet thread's work: the run targets, the alive nodes, the logger pool, node health,
the offline collection and every run's end, advanced one command (or poll) at a time.

Each turn carries out a command, then what is due; its work grows with what changed (a listing
once a poll, a plan on change, pings and summaries batched). Only the fleet thread calls it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from .._config.values import NodeSelection
from .._health import NodeSummary
from .._wandb.writers import Role, WriterSpec
from .._warn import Warner, describe
from .actors import RayActors
from .collect import OfflineCollection
from .commands import (
    REPLANS,
    AttemptEnded,
    AttemptFailed,
    AwaitWriters,
    Command,
    LogArtifact,
    LogRow,
    Prestart,
    Retire,
)
from .consoles import FleetConsoles
from .egress import FleetEgress, RelayPlan
from .health import FleetHealth, judge_final, stragglers
from .listing import END_LISTING_S, NodeListing
from .node_console import FINISH_S as CONSOLE_FINISH_S
from .nodes import NodeInfo
from .plan import plan, run_of
from .pool import LoggerPool
from .ready import Awaits
from .retire import Retirement, advance_all, retire
from .rows import RowRouter
from .target_commands import TARGET_COMMANDS, apply_to_targets
from .targets import RunTarget, SharedTarget, StandaloneTarget, early_nodes, relayed_nodes, writer_spec
from .watches import FleetWatches


class FleetWorker:
    """The order of a fleet thread's turn (``step``) and of a run's end (``_start_retirement``);
    each job is a part's own: the node listing (``listing.NodeListing``), the commands' changes to
    the runs' targets (``target_commands``), the plan (``plan``) carried out on the logger pool
    (``pool.LoggerPool``), the relay (``egress.FleetEgress``), the folders and consoles each logger
    follows (``watches``, ``consoles``), node health (``health``), each run's failures and hangs
    (``failures``, ``hangs``), the offline collection (``collect``) and the retirements (``retire``)."""

    def __init__(
        self,
        *,
        init_timeout_s: float,
        warner: Warner,
        poll_s: float,
        list_nodes: Callable[[], list[dict[str, Any]]],
        actors: RayActors | None,
        clock: Callable[[], float],
        free_resources: Callable[[], dict[str, dict[str, float]]],
        wake: Callable[[], None] = lambda: None,
        relay: RelayPlan | None = None,
    ) -> None:
        self.warner = warner
        self._wake = wake  # a turn of the fleet thread now, not at the next poll
        self.listing = NodeListing(poll_s=poll_s, list_nodes=list_nodes, free_resources=free_resources, clock=clock)
        self.dirty = True  # something the plan reads changed since it last ran
        self.targets: dict[str, RunTarget] = {}
        self.retirements: list[Retirement] = []
        self._rows = RowRouter(warner)  # a standalone run's rows
        self.awaits = Awaits()  # worker-group starts waiting for their node writers
        self.pool = LoggerPool(init_timeout_s=init_timeout_s, warner=warner, ping_s=poll_s, actors=actors, clock=clock)
        self._health = FleetHealth(warner)
        self._watches = FleetWatches(warner)  # the attempt folders each logger watches
        self._consoles = FleetConsoles(warner)  # whose console each logger follows into each run
        self._collection = OfflineCollection(warner)
        self.egress = FleetEgress(warner, relay)  # the relay, and the nodes without a route to W&B

    @property
    def failing(self) -> bool:
        """A run's failed attempt waits for its nodes' facts (or a recovery to be told)."""
        return any(isinstance(t, SharedTarget) and t.failures is not None and t.failures.busy
                   for t in self.targets.values())  # fmt: skip

    @property
    def relaying(self) -> bool:
        """A run learns its nodes from elsewhere (a Train run inside a trial): read, not told."""
        return any(isinstance(t, SharedTarget) and t.relay for t in self.targets.values())

    def step(self, command: Command) -> None:
        """One turn: ``command``, then what is due."""
        try:
            self.apply(command)
            self._refresh_nodes()
            self.pool.check_joins()
            self._check_egress()
            self.pool.check_health(self._spec_for)
            if self.pool.changed:
                self.pool.changed, self.dirty = False, True
            replanned, self.dirty = self.dirty, False
            if replanned:
                self._carry_out_plan()
            self._watches.sync(self.targets, self.pool, replanned)  # after the plan: on the loggers it started
            self._consoles.sync(self.targets, self.pool, replanned)  # after the plan: after the writers' joins
            self._check_health()
            self._check_failures()
            self.awaits.check(self.targets, self.pool, self.listing.alive)
            self.check_retirements()
        except Exception as e:  # noqa: BLE001 - the fleet must outlive any one failure
            self.warner.warn(f"fleet:{type(e).__name__}", f"node loggers could not be updated ({describe(e)})")

    def apply(self, command: Command) -> None:
        self.dirty |= isinstance(command, REPLANS)
        if isinstance(command, AttemptEnded):
            target = self.targets.get(command.run_id)
            hangs = target.hangs if isinstance(target, SharedTarget) else None
            stopped = hangs.stopped if hangs is not None and hangs.open else ()  # the ranks others waited for
            self._consoles.end_attempt(command.run_id, command.failed, self.pool, stopped)
        elif isinstance(command, AttemptFailed):  # its dead ranks' last lines first, as it ends
            self._consoles.attempt_failed(command.run_id, command.failed)
        if isinstance(command, TARGET_COMMANDS):
            apply_to_targets(self.targets, command)
        elif isinstance(command, Retire):
            self._start_retirement(command)
        elif isinstance(command, AwaitWriters):
            self.awaits.add(command.run_ids, command.done)
        elif isinstance(command, Prestart):
            self._refresh_nodes()
            self.pool.prestart(self.listing.prestart_nodes(command))
        elif isinstance(command, (LogRow, LogArtifact)):  # a standalone run's row or checkpoint, to its writer's logger
            target = self.targets.get(command.run_id)
            if isinstance(target, StandaloneTarget):
                self._rows.deliver(command, target, self.pool.host_of(target.run_id))

    def _check_egress(self) -> None:
        """The relay's start, and the ways to W&B the joins that answered found (one warning a
        batch of nodes without one, whose offline runs come to the run at its end)."""
        self.egress.poll(self.pool)
        self.egress.watch(self.pool, self.targets, self._collection.hosted_offline)
        self.egress.took(self.pool.take_ways(), self.targets, self._collection.hosted_offline)
        self.egress.announce(self.pool)

    def _refresh_nodes(self, now_s: float | None = None) -> None:
        """The alive nodes re-read when due (``NodeListing.refresh``; ``now_s``: now, waiting at
        most that long), while a run or a logger needs them; a change re-plans."""
        if (self.targets or self.pool) and self.listing.refresh(now_s):
            self.dirty = True

    def _spec_for(self, key: str, node: NodeInfo) -> WriterSpec | None:  # of writer `key` on `node`
        return writer_spec(self.targets, key, node)

    def _carry_out_plan(self) -> None:
        if not self.targets and not self.pool:
            return
        alive = self.listing.alive
        kinds = {n: i.kind for n, i in alive.items()}
        wants = [t.wants(relayed_nodes(t, self.warner), kinds, stragglers(t)) for t in self.targets.values() if t.ready]
        step = plan(self.pool.runs_by_node(), wants, alive, self._collection.collecting)
        offline = {rid: (i, t.role) for rid, t in self.targets.items() if (i := t.index or t.fallback) is not None}
        for node_id in step.lost:
            handle = self.pool.drop(node_id)
            if handle is not None:
                self._collection.lost(handle.node, offline)
        for node_id, key in step.finish:
            self.pool.finish_writer(node_id, key)
        if step.start:
            self.pool.start([alive[node_id] for node_id in step.start])
        if step.add and self.egress.holding:  # writers join once the run's relay listens (bounded)
            self.dirty = True
        for node_id, key in () if self.egress.holding else step.add:
            spec = self._spec_for(key, alive[node_id])
            if spec is None:
                continue
            host = self.pool.add_writer(node_id, spec)
            target = self.targets[run_of(key)[0]]
            if target.index is not None and spec.role is not Role.OBSERVER:  # offline: collected from here at the end
                self._collection.hosted(node_id, key)
            self._rows.placed(key, host)
        self._health.note_caps(step.capped, self.targets)
        early = early_nodes(self.targets.values(), alive)  # their loggers start before the run exists
        self.pool.prestart([alive[n] for n in sorted(early)])
        if wants and all(w.selection is NodeSelection.WORKERS for w in wants) and any(w.nodes for w in wants):
            self.pool.drop_unused_warm(early.union(*(w.nodes for w in wants)))

    def _check_health(self, only: str | None = None) -> None:
        """Feed each shared run's node health (what changed) and publish what it says (``only``: one run)."""
        health = self._health
        self.dirty |= health.check(self.targets, self.pool, self.listing.alive, only=only, ended=self.listing.ended)

    def _check_failures(self, only: SharedTarget | None = None, final: bool = False) -> None:
        """Tell each shared run's failures that are due (``only``: one run, at its end: ``final``)."""
        for target in [only] if only is not None else list(self.targets.values()):
            if not isinstance(target, SharedTarget) or target.failures is None or not target.failures.busy:
                continue
            try:
                local = self._watches.local_facts(target.primary)
                failures, hangs = target.failures, target.hangs
                failures.step(target, self.pool, self.warner, local, self.listing.alive, final=final, hangs=hangs)
            except Exception as e:  # noqa: BLE001 - the run goes on, and ends
                self.warner.warn(f"failure:{target.run_id}", f"a failure could not be named in the run ({describe(e)})")

    # retiring runs ---------------------------------------------------------------------------
    def _start_retirement(self, how: Retire) -> None:
        run_id = how.run_id
        target = self.targets.get(run_id)
        if target is not None and self._rows.waiting(run_id):
            self._carry_out_plan()  # rows that never found their writer: place it now, so they are not lost
        judge = None
        if isinstance(target, SharedTarget) and (target.hangs is not None or target.failures is not None):
            relayed_nodes(target, self.warner)  # a Train run inside a trial: the ranks it finished, its failures, last
        if target is not None:
            # The nodes as Ray says now, not as last listed (every poll_s): a node Ray marked dead
            # just before the run ended is that run's loss, named in it.
            self._refresh_nodes(now_s=END_LISTING_S)
            self._check_health(only=run_id)  # what the pings brought, judged now
        if isinstance(target, SharedTarget) and target.failures is not None:
            self._check_failures(only=target, final=True)  # before the primary's finish: the failure in the run
        if isinstance(target, SharedTarget) and target.hangs is not None:
            close_hangs(target, self.pool, self.warner)  # before the primary's finish: the last notice in the run
        if isinstance(target, SharedTarget) and target.health is not None:
            # the final judgement and the last tables: once the node writers have finished (every
            # shared run with node health, with hang detection or without)
            judge = functools.partial(self._judge_final, target)
        self.egress.announce(self.pool, ending=run_id)  # nodes without a route found last: named before the end
        self.egress.forget(run_id)
        self.targets.pop(run_id, None)
        # The console of the ranks on the fleet's own node ends now; its last lines reach the
        # primary's queue before the primary's finish (``then``), within the run's bound: a step of
        # the retirement, never a wait of the fleet thread.
        console = self._consoles.retire(run_id, failed=how.exit_code not in (None, 0), pool=self.pool)
        self._rows.drop(run_id)
        self._health.forget(run_id)
        retirement = retire(run_id, target, self.pool, self._collection, self.warner, how, judge)
        if console is not None and how.then is not None:
            retirement.console = console
            retirement.console_until = time.monotonic() + min(how.timeout, CONSOLE_FINISH_S)
        self.retirements.append(retirement)
        retirement.wake_on_each_finish(self._wake)  # no poll's wait

    def check_retirements(self, final: bool = False) -> None:  # one step of every run's end
        self.retirements = advance_all(self.retirements, self.pool, self._collection, self.warner, final)

    def shutdown(self, timeout: float) -> None:
        """Retire the runs still open (their writers only: each primary is its session's)."""
        for run_id in list(self.targets):
            self._start_retirement(Retire(run_id, timeout, None, 1, threading.Event()))
        self._watches.sync(self.targets, self.pool, replanned=True)  # every run's folders let go (their ranks ended)
        deadline = time.monotonic() + timeout
        while self.retirements and time.monotonic() < deadline:
            self.check_retirements()
            if self.retirements:
                time.sleep(0.1)
        self.check_retirements(final=True)
        self._watches.close()
        self.egress.stop()  # every writer that sent through it has finished

    def _judge_final(self, target: SharedTarget, last: dict[str, NodeSummary]) -> None:
        """The run's final judgement (on the fleet thread, once its writers have finished), with
        the nodes as Ray says then: a node Ray marked dead while they finished (a host killed: its
        ranks' failure ends the run before Ray knows the node dead) is the run's loss, named in it."""
        self._refresh_nodes(now_s=END_LISTING_S)
        if target.health is not None and self.listing.alive:
            target.health.alive(self.listing.alive, ended=self.listing.ended)
        judge_final(target, self.warner, last)

    def release(self) -> None:
        """The thread ends: nobody waits on it any longer."""
        self.awaits.release_all()
        for r in self.retirements:
            r.writers_done.set()


def close_hangs(target: SharedTarget, pool: LoggerPool, warner: Warner) -> None:
    """The run's end, before its primary finishes: an open hang's closing notice (``HangWatch.close``)."""
    if target.hangs is None:
        return
    try:
        target.hangs.close(target, pool, target.primary.hang)
    except Exception as e:  # noqa: BLE001 - the run's end goes on
        warner.warn(f"hang-close:{target.run_id}", f"the open hang's closing notice failed ({describe(e)})")
