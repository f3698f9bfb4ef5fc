"""The lost-GPU rule (pure): a GPU seen earlier whose every series stops while its node samples on.

What it relies on is how wandb's monitor (``wandb-symon``, ``xpu/src/gpu_nvidia.rs`` in wandb
0.31) samples NVIDIA GPUs: each metric of each GPU (utilisation, memory, temperature, power, its
limit, clocks, ECC counts) is asked on its own, and the first error for one of them stops that
one metric for that GPU for the rest of the writer's life, whatever the error; the others go on.

- A GPU that falls off the bus fails every NVML call (``NVML_ERROR_GPU_IS_LOST``), its handle
  lookup included: all of its series stop at once. That is "lost" here.
- A GPU in MIG mode answers ``NVML_ERROR_NOT_SUPPORTED`` for utilisation and nothing else: it
  never has a utilisation series, and its memory, temperature and power series go on. Not lost.
- A healthy GPU whose utilisation read failed once loses that series for good, and keeps the
  others. Not lost either.

So a GPU counts as present in a node's fresh samples while any of its series reports, and as
missing only when none does while the node's writer samples on (its CPU, memory or other GPUs).
Missing for the window (and the minimum of samples) it is lost, an ERROR, and never also a slow
or idle GPU. It is back once it has reported again for as long (a logger restarted on a repaired
node, whose new monitor asks again): INFO. A node whose writer stops altogether is the node-lost
rule's, not this one's. A GPU already off the bus when the writer's monitor starts is never seen
by it: wandb then reports no GPU of that node at all (its NVIDIA monitor fails to start when one
handle lookup fails), and a GPU job's node that shows no GPU gets its one warning instead.
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
