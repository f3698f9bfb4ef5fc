"""One node as the run's node health keeps it: its ranks, its latest summary and how old it is,
its value and state, whether it is gone: a plain value the judge, the tables and the alerts read."""

from __future__ import annotations

from dataclasses import dataclass

from .kinds import NodeState
from .messages import NodeSummary


@dataclass
class TrackedNode:
    """One node as the monitor keeps it."""

    node_id: str
    label: str
    hostname: str
    ranks: tuple[int, ...] = ()
    summary: NodeSummary | None = None
    summaries: int = 0  # how many it has taken (a new one: its value is worked out again)
    fresh: int = 0  # system samples not judged yet
    metric: float | None = None
    state: NodeState = NodeState.OK
    in_run: bool = True
    ranks_off_at: float | None = None  # when its ranks last went off it (a restart, a resize, the run leaving it)
    gone: bool = False  # seen gone from the cluster (judged lost or left, once)
    had_ranks: tuple[int, ...] = ()  # its last ranks (a lost node's alert); empty: it never hosted one
    got: tuple[float, float] | None = None  # its summary's arrival (this clock), and age then (the node's)
    kind: str | None = None  # what the system rule compares it as ("gpu:<model>", "cpu"), sticky for GPUs
    ints_t: float | None = None  # the newest integer GPU samples of its summary
    fresh_t0: float | None = None  # when its oldest sample not judged yet was taken (the node's clock)
    intervals: int = 0  # sampling intervals its summaries have stood for, in all
    expects_gpu: bool = False  # Ray gave its ranks GPUs
    no_gpu_said: bool = False  # its "no GPU reported" warning is out

    def age(self, now: float) -> float | None:
        """Its latest sample's age: as the node said on arrival, plus the time since (this clock)."""
        return None if self.got is None else self.got[1] + max(0.0, now - self.got[0])

    def span(self) -> tuple[float, float] | None:
        """When its samples not judged yet were taken (the node's clock)."""
        if self.fresh_t0 is None or self.summary is None:
            return None
        return float(self.fresh_t0), float(self.summary.t)
