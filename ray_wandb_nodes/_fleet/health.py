"""The fleet's side of node health: feed each shared run's monitor and hand its output to the
run's primary. Runs on the fleet thread, after each plan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._warn import Warner
from .nodes import NodeInfo
from .pool import LoggerPool
from .targets import SharedTarget


def feed(target: SharedTarget, pool: LoggerPool, alive: Mapping[str, NodeInfo], known: dict[str, NodeInfo]) -> None:
    """Tell ``target``'s monitor its nodes, the latest summary of each, and which are alive."""
    health = target.health
    if health is None:
        return
    known.update(alive)
    wanted = set(target.nodes) | set(target.ranks)
    if target.covered_node:
        wanted.add(target.covered_node)
    if target.selection == "cluster":
        wanted |= set(alive)
    infos = {n: known[n] for n in wanted if n in known}
    health.set_nodes({n: (i.label, i.hostname) for n, i in infos.items()}, target.ranks)
    for node_id in infos:
        handle = pool.get(node_id)
        if handle is not None:
            health.summary(node_id, handle.summary)
    if target.covered_node:
        health.summary(target.covered_node, target.primary.summary)
    if alive:  # empty before the first listing
        health.alive(alive)


def publish(target: SharedTarget, warner: Warner, final: bool = False) -> None:
    """Raise the monitor's alerts (W&B alerts when on; a warning each way) and log the straggler
    count and the node table when due."""
    health = target.health
    if health is None or not target.ready:
        return
    result = health.tick(final=final)
    for alert in result.alerts:
        warner.warn(f"health:{target.run_id}:{alert.kind}:{alert.node}:{len(health.raised)}", alert.text)
        if health.options.alerts:
            target.primary.alert(alert)
    if result.stragglers is not None or result.table is not None:
        target.primary.log_health(result.stragglers, result.table)


def rank_report(target: Any, metrics: list[dict[str, Any]], now: float) -> None:
    health = getattr(target, "health", None)
    if health is not None:
        health.report(metrics, now)
