"""One GPU as the run's GPU health keeps it (its latest values, its batches not judged yet, each
rule's streak, its state), and a GPU rule's verdict on it (:class:`GpuEvent`): plain values that
the rules, the tables and the alerts read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .gpu_ecc import EccWatch
from .kinds import EventKind, GpuState
from .messages import GpuInts
from .rule import NodeStreak


@dataclass
class Gpu:
    node_id: str
    index: int
    model: str = ""
    ranks: tuple[int, ...] = ()
    util: float | None = None
    mem: float | None = None
    temp: float | None = None
    power: float | None = None
    limit: float | None = None
    sm: float | None = None
    busy_sm: float | None = None  # the mean SM clock of its newest block's busy samples
    busy_util: float | None = None
    ecc_c: float | None = None
    ecc_u: float | None = None
    # batches not judged yet: (start, end, samples, present); (start, end, samples, GpuInts)
    floats: tuple[float, float, int, bool] | None = None
    ints: list[tuple[float, float, int, GpuInts]] = field(default_factory=list)
    slow: NodeStreak = field(default_factory=NodeStreak)
    idle: NodeStreak = field(default_factory=NodeStreak)
    lost: NodeStreak = field(default_factory=NodeStreak)
    ecc: EccWatch = field(default_factory=EccWatch)
    ecc_first: float | None = None
    waiting: bool = False  # idle while its ranks set up or save a checkpoint: no verdict, not the node's value

    @property
    def state(self) -> GpuState:
        if self.lost.flagged:
            return GpuState.LOST
        if self.ecc.ever:
            return GpuState.MEMORY_ERRORS
        if self.slow.flagged:
            return GpuState.SLOW
        return GpuState.IDLE if self.idle.flagged else GpuState.OK

    @property
    def suspect(self) -> bool:
        """Flagged, or on its way to be: its node's value leaves it out (one problem, one alert)."""
        slow, idle, lost = self.slow, self.idle, self.lost  # the node rule asks this of every GPU, each tick
        return (
            lost.flagged or self.ecc.ever or slow.flagged or idle.flagged or self.waiting
            or slow.since is not None or idle.since is not None or lost.since is not None
        )  # fmt: skip


class GpuEvent(NamedTuple):
    """A GPU rule's verdict: ``gpu`` as it was then, the rule's ``kind``, and whether the GPU
    ``recovered`` from it (else it is flagged now). The live alert and the offline report's
    flag are both written from it (``alerts.gpu_finding``)."""

    gpu: Gpu
    kind: EventKind
    recovered: bool
