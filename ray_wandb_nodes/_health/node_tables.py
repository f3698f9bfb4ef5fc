"""When a run's ``nodes`` and ``gpus`` tables are due, and their rows from the monitor's nodes:
what a row says besides the node itself (observed only, its ranks' progress age, its judged value
and the others' median). Plain data; the ``HealthMonitor`` owns one and asks it at each tick."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .gpus import GpuHealth
from .node_judge import NodeJudge
from .table import node_order, node_row
from .tracked import TrackedNode


class NodeTables:
    """The run's node tables: their pace, and what their rows need that no node holds."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self.observed: set[str] = set()  # nodes past the writer cap: their series are not in the run
        self._progress: dict[str, tuple[float, float]] = {}  # node -> (its ranks' oldest progress age, when noted)
        self._at: float | None = None
        self._tabled = False  # a table logged yet (the first alert brings one at once)

    def progress(self, ages: dict[str, float], now: float) -> None:
        """Each node's oldest seconds since a rank's progress (hang detection reads the beacons)."""
        self._progress = {node: (age, now) for node, age in ages.items()}

    def _progress_age(self, node_id: str, now: float) -> float | None:
        noted = self._progress.get(node_id)
        return noted[0] + max(0.0, now - noted[1]) if noted else None

    def due(self, now: float, final: bool, alerted: bool) -> bool:
        """Whether the tables are due now (and, if so, noted as logged): every ``every_s`` and at the
        end; the first alert brings the first table at once (a W&B table is a new artifact version
        each time: never more often than ``every_s``)."""
        if self._at is None:
            self._at = now  # the first table one interval in (or at the end)
        if final or (alerted and not self._tabled) or now - self._at >= self._every_s:
            self._at, self._tabled = now, True
            return True
        return False

    def rows(self, nodes: Iterable[TrackedNode], judge: NodeJudge, gpus: GpuHealth, now: float) -> list[list[Any]]:
        """The ``nodes`` table's rows now."""
        return [
            node_row(
                node,
                observed=node.node_id in self.observed,
                age=node.age(now),
                value=judge.value(node, gpus)[1],
                median=judge.median(node.node_id),
                gpus_not_ok=gpus.not_ok(node.node_id),
                progress_age=self._progress_age(node.node_id, now),
            )
            for node in node_order(nodes)
        ]
