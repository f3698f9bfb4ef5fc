"""Whose console each node logger follows into each run, kept in step with the runs' placements
(on the fleet thread), and the console of the ranks on the fleet's own node, which the run's
primary writes (that node has no node writer).

A shared run with ``rank_console`` on knows, from each worker-group start (and each replaced
replica group), its ranks on each node and their process ids. Each node's logger that writes for
the run gets :class:`~.wire.ConsoleRanks` (its ranks there, their pids, the run's budget) when
they change, and :class:`~.wire.ConsoleEnd` when an attempt ends; at the run's end its writer's
finish ends the console first. A failed attempt's end names its dead ranks on each node, each with
its share of the run's pool of last lines for dead ranks (``_console.budget.dead_allowance``): the
fleet thread knows every node's, and keeps the pool for the run. The fleet's own node (the run's
``covered_node``) is followed by a tailer of the fleet's, whose lines go on the primary's queue,
ended before the primary finishes.
Nodes past the run's writer cap (observers) and writers that could not join have no run to
write to: their ranks' console is not in the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._config.values import ConsoleMode
from .._console import ConsolePlan, ConsoleTailer, RankProcess, dead_allowance, plan_console
from .._failure import FailedAttempt, Shape, shape_of
from .._warn import Warner, describe
from .node_console import ray_logs
from .pool import LoggerHandle, LoggerPool
from .targets import RunTarget, SharedTarget
from .wire import ConsoleEnd, ConsoleRanks

Wanted = dict[str, dict[str, ConsoleRanks]]  # node id -> run id -> its ranks' console there


def wanted_consoles(targets: Iterable[RunTarget]) -> tuple[Wanted, dict[str, ConsoleRanks]]:
    """What the runs want followed (pure): on each node, each run's ranks there with their
    processes and the run's budget (one plan a run: its world size, its nodes with ranks); and on
    the fleet's own node (a run's ``covered_node``), each run's. Only a shared run that exists, with
    its console on and its ranks' processes known, wants anything."""
    remote: Wanted = {}
    local: dict[str, ConsoleRanks] = {}
    for t in targets:
        if not isinstance(t, SharedTarget) or t.console is ConsoleMode.OFF or not t.ready or not t.pids:
            continue
        placed = {
            node: procs
            for node, ranks in t.ranks.items()
            if (procs := tuple(RankProcess(r, t.pids[r]) for r in sorted(ranks) if r in t.pids))
        }
        if not placed:
            continue
        plan = plan_console(t.console, world_size=sum(len(p) for p in placed.values()), nodes=len(placed))
        for node, procs in placed.items():
            ranks = ConsoleRanks(t.run_id, procs, plan)
            if node == t.covered_node:
                local[t.run_id] = ranks
            else:
                remote.setdefault(node, {})[t.run_id] = ranks
    return remote, local


def dead_ranks(failed: FailedAttempt | None, stopped: Sequence[int] = ()) -> tuple[int, ...]:
    """The ranks a failed attempt leaves dead, the first to read first (pure): those a hang named
    stopped (the rank the others waited for, alive or not); where every raise was a collective's
    timeout, the ranks Ray's poll found running (the ones the others waited for); those whose
    process Ray's deciding poll found gone, those that raised, those whose poll never answered."""
    order = list(stopped)
    poll = failed.poll if failed is not None else None
    if poll is not None:
        raised = [e for e in poll.errors if not (e.died or e.preempted or e.timed_out)]
        died = [e for e in poll.errors if e.died]
        timeouts = bool(raised) and all(
            shape_of(e.error_type, e.message, e.causes, e.traceback) is Shape.PEER_TIMEOUT for e in raised
        )
        if timeouts or (not raised and len(died) > len(poll.running) > 0):
            # Every raise a collective's timeout, or most ranks dead at once with none raising (NCCL's
            # watchdog aborts its waiters): the ranks still running are the ones waited for.
            order += poll.running
        order += [e.rank for e in poll.errors if e.died or e.preempted or e.timed_out]
        order += [e.rank for e in poll.errors]
        order += poll.unanswered
    return tuple(dict.fromkeys(order))


class FleetConsoles:
    """The fleet's side of the node loggers' consoles, and the console of the fleet's own node."""

    def __init__(self, warner: Warner, logs_dir: Callable[[], str | None] | None = None) -> None:
        self._warner = warner
        self._logs_dir = logs_dir  # None: this node's (``_ray.logs_dir``), asked when first needed
        self._seen: Any = None  # what the last sync read: nothing changed, nothing to do
        self._local: dict[str, ConsoleTailer] = {}  # run id -> the tailer of the fleet's own node
        self._local_ranks: dict[str, ConsoleRanks] = {}  # run id -> as last told its tailer
        self._failed: dict[str, FailedAttempt] = {}  # run id -> its attempt that failed, till it ends
        self._dead_left: dict[str, int] = {}  # run id -> what is left of its pool for dead ranks

    def sync(self, targets: Mapping[str, RunTarget], pool: LoggerPool, replanned: bool) -> None:
        """Tell each logger (and the fleet's own tailers) the ranks each run has on its node, where
        they changed: on a change of the runs' placements, or after a plan (``replanned``: writers
        added, loggers started or restarted)."""
        shape = [
            (t.run_id, t.ready, t.covered_node, t.ranks, t.pids, getattr(t, "console", ConsoleMode.OFF))
            for t in targets.values()
        ]
        if not replanned and shape == self._seen:
            return
        self._seen = shape
        remote, local = wanted_consoles(targets.values())
        for handle in pool.handles():
            self._send(handle, remote.get(handle.node.node_id, {}), targets)
        self._sync_local(local, targets)

    def _send(self, handle: LoggerHandle, wanted: dict[str, ConsoleRanks], targets: Mapping[str, RunTarget]) -> None:
        try:
            for run_id, ranks in wanted.items():
                # Only to a logger hosting the run's writer: sent after its join, the call runs after it.
                if run_id in handle.runs and handle.consoles.get(run_id) != ranks:
                    handle.actor.console.remote(ranks)
                    handle.consoles[run_id] = ranks
            for run_id in handle.consoles.keys() - wanted.keys():
                told = handle.consoles.pop(run_id)
                if run_id in targets and run_id in handle.runs:  # the run's ranks left this node
                    handle.actor.console.remote(ConsoleRanks(run_id, (), told.plan))
        except Exception as e:  # noqa: BLE001 - a logger that is gone: its replacement is told afresh
            what = f"could not tell {handle.node.label} its ranks' console ({describe(e)})"
            self._warner.warn(f"console:{handle.node.node_id}", what)

    def _sync_local(self, local: dict[str, ConsoleRanks], targets: Mapping[str, RunTarget]) -> None:
        for run_id, ranks in local.items():
            if self._local_ranks.get(run_id) == ranks:
                continue
            tailer = self._local.get(run_id) or self._start_local(targets[run_id], ranks)
            if tailer is not None:
                tailer.watch(ranks.ranks, ranks.plan)
                self._local_ranks[run_id] = ranks
        for run_id in self._local_ranks.keys() - local.keys():
            told = self._local_ranks.pop(run_id)
            tailer = self._local.get(run_id)
            if tailer is not None and run_id in targets:  # the run's ranks left the fleet's node
                tailer.watch((), told.plan)

    def _start_local(self, target: RunTarget, ranks: ConsoleRanks) -> ConsoleTailer | None:
        if not isinstance(target, SharedTarget):
            return None
        logs = ray_logs(self._logs_dir, self._warner, "the Train controller's node")
        if logs is None:
            return None
        tailer = ConsoleTailer(ranks.plan, logs, target.primary.console_lines, warner=self._warner).start()
        self._local[target.run_id] = tailer
        return tailer

    def attempt_failed(self, run_id: str, failed: FailedAttempt) -> None:
        """The run's attempt failed (Ray decided on it before its worker group shuts down): its
        dead ranks go first when it ends."""
        self._failed[run_id] = failed

    def end_attempt(self, run_id: str, failed: bool, pool: LoggerPool, stopped: Sequence[int] = ()) -> None:
        """The run's attempt ended: each node following its ranks, and the fleet's own, end them
        (their last lines to the run when it ``failed``, its dead ranks' first: those its failure
        named, and ``stopped``, those an open hang named). Never waits."""
        told = [(h, h.consoles[run_id]) for h in pool.handles() if run_id in h.consoles]
        local = self._local_ranks.get(run_id)
        every = [ranks for _, ranks in told] + ([local] if local else [])
        named = dead_ranks(self._failed.pop(run_id, None), stopped) if failed else ()
        followed = {rp.rank for ranks in every for rp in ranks.ranks}
        allowed = self._allow(run_id, [r for r in named if r in followed], every[0].plan if every else None)
        for handle, ranks in told:
            end = ConsoleEnd(run_id, failed, _theirs(allowed, ranks))
            try:
                handle.actor.console_end.remote(end)
            except Exception as e:  # noqa: BLE001 - a logger that is gone ended with its ranks
                self._warner.warn(f"console:{handle.node.node_id}", f"could not end {handle.node.label}'s "
                                  f"console of the attempt ({describe(e)})")  # fmt: skip
        tailer = self._local.get(run_id)
        if tailer is not None:
            tailer.end_attempt(failed, _theirs(allowed, local) if local else ())

    def _allow(self, run_id: str, dead: list[int], plan: ConsolePlan | None) -> dict[int, int]:
        """Each dead rank's lines from the run's pool, taken from it (see ``budget``)."""
        if not dead or plan is None:
            return {}
        left = self._dead_left.setdefault(run_id, plan.dead_tails)
        allowed = dead_allowance(dead, plan.tail, left)
        self._dead_left[run_id] = left - sum(allowed.values())
        return allowed

    def retire(self, run_id: str, failed: bool, pool: LoggerPool) -> ConsoleTailer | None:
        """The run ends: its loggers end its console in their writers' finish; the fleet's own
        tailer is asked to end now (never waited for here): returned, for the primary's finish to
        wait on (see ``FleetWorker``)."""
        for handle in pool.handles():
            handle.consoles.pop(run_id, None)
        self._local_ranks.pop(run_id, None)
        self._failed.pop(run_id, None)
        self._dead_left.pop(run_id, None)
        tailer = self._local.pop(run_id, None)
        if tailer is not None:
            tailer.request_finish(failed)
        return tailer


def _theirs(allowed: Mapping[int, int], ranks: ConsoleRanks) -> tuple[tuple[int, int], ...]:
    """The dead ranks of ``allowed`` among ``ranks``, in the order named."""
    mine = {rp.rank for rp in ranks.ranks}
    return tuple((rank, lines) for rank, lines in allowed.items() if rank in mine)
