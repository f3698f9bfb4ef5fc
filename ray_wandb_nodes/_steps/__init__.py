"""Slow ranks: every rank's step taken apart on its own clock, and the rank the others wait for.

The rank's side: the train worker's set-up puts the hooks in place (``_worker.steps``: the
optimizer's global step hooks, ``next()`` on training iterators in ``_worker.step_inputs``,
DDP's reducer timers read in ``ddp``) that feed one ``recorder`` a process, which publishes
running totals into the region its beacon slot keeps for it (``region``: the layout, the writer,
the decoder). The reading side: ``marks`` keeps every
rank's reads as points by step count, on its node between pings and on the driver side, and
makes windows from the same steps of every rank, however old the reads; ``windows`` turns two
points of a rank into its per-step parts; ``attribution`` names the slow
rank, its cause and its impact (pure); ``flight`` gives collective waits from the flight
recorder where DDP is not used. Nothing here imports Ray, wandb or torch at import time: the
hooks are put in place as their modules are imported (``_worker.on_import``). The rule, its alerts and
the ``ranks`` table are node health's (``_health.rank_rule``, ``_health.rank_table``).
"""

from .attribution import Attribution, Basis, Cause, CommFinding, RankFinding, attribute
from .ddp import CPU_RATE, CUDA_RATE, DdpSums, PatchDdp, ddp_sums, sampled_iterations
from .flight import CollectiveWait, TimedCollective, collective_waits, timed_collectives
from .marks import NodePoints, StepMarks, at_step
from .recorder import StepRecorder
from .region import REGION_SIZE, RankSteps, RegionWriter, Sources, StepTotals, decode
from .windows import RankWindow, rank_window

__all__ = [
    "CPU_RATE",
    "CUDA_RATE",
    "REGION_SIZE",
    "Attribution",
    "Basis",
    "Cause",
    "CollectiveWait",
    "CommFinding",
    "DdpSums",
    "NodePoints",
    "PatchDdp",
    "RankFinding",
    "RankSteps",
    "RankWindow",
    "RegionWriter",
    "Sources",
    "StepMarks",
    "StepRecorder",
    "StepTotals",
    "TimedCollective",
    "at_step",
    "attribute",
    "collective_waits",
    "ddp_sums",
    "decode",
    "rank_window",
    "sampled_iterations",
    "timed_collectives",
]
