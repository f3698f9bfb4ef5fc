"""Waiting for a run's node writers: who is waiting, and whether every writer a run wants has
answered its join (a writer's first sample is taken as it joins: wandb samples at once)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .nodes import NodeInfo, select_nodes
from .plan import observer_key
from .pool import LoggerPool
from .targets import RunTarget


@dataclass
class Await:
    run_ids: frozenset[str]
    done: threading.Event


class Awaits:
    def __init__(self) -> None:
        self._waiting: list[Await] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, run_ids: Collection[str], done: threading.Event) -> None:
        self._waiting.append(Await(frozenset(run_ids), done))

    def check(self, targets: Mapping[str, RunTarget], pool: LoggerPool, alive: Mapping[str, NodeInfo]) -> None:
        """Release every wait whose runs' writers have all answered their joins."""
        still = []
        for a in self._waiting:
            if all(_ready(targets.get(r), pool, alive) for r in a.run_ids):
                a.done.set()
            else:
                still.append(a)
        self._waiting = still

    def release_all(self) -> None:
        for a in self._waiting:
            a.done.set()
        self._waiting = []


def _ready(target: RunTarget | None, pool: LoggerPool, alive: Mapping[str, NodeInfo]) -> bool:
    if target is None or not target.ready or not alive:
        return True  # no run to join (not created: W&B unreachable, or over): nothing to wait for
    wanted = select_nodes(target.selection, target.nodes, alive, target.covered_node)
    keys = (target.run_id, observer_key(target.run_id))
    return all(any((node, k) in pool.joined for k in keys) for node in wanted)
