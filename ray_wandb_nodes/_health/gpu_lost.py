"""The lost-GPU rule (pure): a GPU seen earlier that stops reporting while its node samples on.

A GPU that falls off the bus fails every NVML call; wandb's monitor then stops that GPU's series
(it asks a failing metric no more), while the node's writer keeps sampling its CPU, memory and
other GPUs. So a GPU of a node's earlier samples that is missing from the node's fresh samples
counts as missing; missing for the window (and the minimum of samples) it is lost, an ERROR, and
never also a slow or idle GPU. It is back once it has reported again for as long (a logger
restarted on a repaired node): INFO. A node whose writer stops altogether is the node-lost
rule's, not this one's.
"""

from __future__ import annotations

from .kinds import GpuState
from .rule import NodeStreak, advance


def lost_step(
    streak: NodeStreak, present: bool, samples: int, start: float, end: float, window_s: float, min_samples: int
) -> GpuState | None:
    """One fresh batch of a node's samples, with this GPU ``present`` in it or not: its new
    state when it changed (``LOST``, or ``OK`` once back), else None. ``streak`` (flagged: lost)
    is updated."""
    if advance(streak, not present, samples, start, end, window_s, min_samples):
        return GpuState.LOST if streak.flagged else GpuState.OK
    return None
