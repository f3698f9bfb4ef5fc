"""The fleet's side of node health: feed each shared run's monitor (its nodes' summaries, its
ranks' step totals) and hand its output to the run's primary. Runs on the fleet thread, after
each plan."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .._config.values import NodeSelection
from .._health import NodeEnd, NodeSummary, read_warning
from .._warn import Warner
from .cap import cap_warning
from .nodes import NodeInfo
from .pool import LoggerPool
from .steps import feed_steps
from .targets import HealthFed, RunTarget, SharedTarget


def feed(
    target: SharedTarget,
    pool: LoggerPool,
    alive: Mapping[str, NodeInfo],
    known: Mapping[str, NodeInfo],
    updated: Collection[str],
    observed: frozenset[str] = frozenset(),
    ended: Mapping[str, NodeEnd] | None = None,
) -> None:
    """Tell ``target``'s monitor what changed: its nodes (when they or the alive nodes changed),
    the summaries of the ``updated`` nodes, and the alive nodes (``ended``: how the dead ones
    ended, as Ray says). Work grows with the changes."""
    health = target.health
    if health is None:
        return
    wanted = set(target.nodes) | set(target.ranks)
    if target.covered_node:
        wanted.add(target.covered_node)
    if target.selection is NodeSelection.CLUSTER:
        wanted |= set(alive)
    fed = HealthFed(frozenset(wanted), id(target.ranks), observed, len(known), id(alive))
    if fed != target.health_fed:
        target.health_fed = fed
        infos = {n: known[n] for n in wanted if n in known}
        new = health.set_nodes(
            {n: (i.label, i.hostname) for n, i in infos.items()}, target.ranks, observed, target.rank_gpus
        )
        if alive:  # empty before the first listing
            health.alive(alive, ended=ended)
        updated = set(updated) | new  # a node new to the monitor brings its summary
    for node_id in updated:
        handle = pool.get(node_id)
        if handle is not None:  # this run's writer's samples there, never another run's
            health.summary(node_id, handle.summaries.get(target.run_id))
    if target.covered_node:
        health.summary(target.covered_node, target.primary.summary)


def stragglers(target: RunTarget) -> frozenset[str]:
    """The nodes ``target``'s monitor holds for stragglers now (none without a monitor)."""
    health = getattr(target, "health", None)
    return health.straggler_nodes() if health is not None else frozenset()


def publish(target: SharedTarget, warner: Warner, final: bool = False) -> None:
    """Raise the monitor's alerts (W&B alerts when on; a warning each way) and log the straggler
    count and the node table when due."""
    health = target.health
    if health is None or not target.ready:
        return
    result = health.tick(final=final)
    for notice in result.notices:  # a node health cannot see in full: one warning each
        warner.warn(f"{notice.kind}:{target.run_id}:{notice.node_id}", notice.text)
    if target.covered_node:  # the primary samples its own node: its reader's problems are said here
        for p in target.primary.read_problems:
            warner.warn(f"{p.kind}:{target.covered_node}:{p.cause}", read_warning(target.primary.spec.label, p))
    for alert in result.alerts:
        warner.warn(f"health:{target.run_id}:{alert.kind}:{alert.node}:{len(health.raised)}", alert.text)
        if health.options.alerts:
            target.primary.alert(alert)
    if result.stragglers is not None or result.table is not None:
        target.primary.log_health(result.stragglers, result.table, result.gpu_table)
    if result.rank_history is not None or result.rank_table is not None:
        target.primary.log_ranks(result.rank_history, result.rank_table)


def judge_final(target: SharedTarget, warner: Warner, last: Mapping[str, NodeSummary]) -> None:
    """The run's last word on its nodes, once its node writers have finished and before its
    primary does: each node's last summary (``last``: node id ->, the integer GPU series of its
    writer's last, partial transaction-log block included, which no ping could carry), and the
    primary's own node's, judged by every rule; the alerts and the last tables go to the primary
    ahead of its finish, so a GPU failure that ended the run is in the run."""
    health = target.health
    if health is None:
        return
    for node_id, summary in last.items():
        health.summary(node_id, summary)
    if target.covered_node:
        health.summary(target.covered_node, target.primary.summary)
    publish(target, warner, final=True)


def rank_report(target: Any, metrics: list[dict[str, Any]], now: float, checkpoint: bool = False) -> None:
    health = getattr(target, "health", None)
    if health is not None:
        health.report(metrics, now, checkpoint)


class FleetHealth:
    """What the fleet keeps for node health across runs: every node seen alive (a lost one keeps
    its name) and, per run past its writer cap, the nodes observed only."""

    def __init__(self, warner: Warner) -> None:
        self._warner = warner
        self._known: dict[str, NodeInfo] = {}
        self._observed: dict[str, frozenset[str]] = {}
        self._alive: Mapping[str, NodeInfo] = {}

    def note_caps(self, capped: tuple[tuple[str, int, frozenset[str]], ...], targets: Mapping[str, RunTarget]) -> None:
        """Say once per run that it went past its writer cap; remember who is observed only."""
        for run_id, members, observers in capped:
            if run_id not in self._observed:
                cap = targets[run_id].max_writers
                self._warner.warn(f"cap:{run_id}", cap_warning(run_id, members, len(observers), cap))
        self._observed = {run_id: observers for run_id, _, observers in capped}

    def forget(self, run_id: str) -> None:
        self._observed.pop(run_id, None)

    def check(
        self,
        targets: Mapping[str, RunTarget],
        pool: LoggerPool,
        alive: Mapping[str, NodeInfo],
        *,
        only: str | None = None,
        final: bool = False,
        ended: Mapping[str, NodeEnd] | None = None,
    ) -> bool:
        """Feed every shared run's monitor (``only``: one run's) and publish what it says; True
        when a capped run's stragglers changed (its members may change: re-plan)."""
        if alive is not self._alive:  # the fleet replaces its alive nodes only when they change
            self._alive = alive
            self._known.update(alive)
        # One run's last check reads the updated nodes and leaves them for the other runs.
        updated = pool.take_updated() if only is None else pool.updated_now()
        replan = False
        for target in list(targets.values()):
            if isinstance(target, SharedTarget) and target.health is not None and only in (None, target.run_id):
                before = stragglers(target)
                observed = self._observed.get(target.run_id, frozenset())
                feed(target, pool, alive, self._known, updated, observed, ended)
                feed_steps(target, pool, self._known)
                publish(target, self._warner, final=final)
                _tell_wants_report(target)
                if target.hangs is not None and target.ready and not final:
                    target.hangs.check(target, pool, self._warner, target.primary.hang)
                replan |= target.max_writers is not None and stragglers(target) != before
        return replan


def _tell_wants_report(target: SharedTarget) -> None:
    """Tell the run's hooks whether its node health waits for its ranks' next report (their
    first on a node learnt of since), through the target's event: the fleet thread owns the monitor."""
    if target.health is not None and target.health.awaits_report:
        target.wants_report.set()
    else:
        target.wants_report.clear()
