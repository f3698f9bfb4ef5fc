"""A simulated fleet that records the calls each node logger gets (``bench/fleet_scale.py``'s
nodes and loggers): the fleet's unit tests assert on what it asked of which logger, in order."""

from __future__ import annotations

from typing import Any

from bench.fleet_scale import Ref, SimActor, SimCluster
from tests.support.fakes import Clock


class Recorded(SimActor):
    """A simulated logger that records the calls it gets."""

    def call(self, name: str, args: tuple[Any, ...]) -> Ref:
        self._sim.calls.append((self.node_id, name, args))  # type: ignore[attr-defined]
        return super().call(name, args)


class RecordingCluster(SimCluster):
    def __init__(self, n: int, clock: Clock) -> None:
        super().__init__(n, clock)
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []
        self.actors: dict[str, Recorded] = {}

    def create(self, node_id: str, group_name: str) -> tuple[Any, Any]:
        self.actors[node_id] = Recorded(self, node_id)
        return self.actors[node_id], group_name

    def taken(self, *names: str) -> list[tuple[str, str, tuple[Any, ...]]]:
        """The calls named ``names`` since the last time, in order."""
        out = [c for c in self.calls if c[1] in names]
        self.calls = []
        return out
