"""When node health sees less of a node than it should (pure): the decisions, and the words of
the one warning each gets (per node and cause), so that a silent loss of the GPU rules never is.

- wandb's transaction log of a node's writer cannot be read (a damaged file, or a wandb release
  that changed its private format): that node's SM clock and ECC counts stop, and with them its
  slow-GPU and memory-error alerts;
- a node whose train ranks Ray gave GPUs reports no GPU in its writer's samples (NVML missing
  from the container, or its driver not loaded yet): the node is judged by its CPU share.
"""

from __future__ import annotations

from .alerts import ranks_text
from .kinds import Degradation
from .messages import ReadProblem

# A GPU node's first samples may hold no GPU yet (wandb sends the GPU readings as records of
# their own): this many sampling intervals without any is no GPU at all.
NO_GPU_INTERVALS = 5


def reports_no_gpu(expects_gpu: bool, intervals: int, gpu_seen: bool) -> bool:
    """Whether a node whose ranks were given GPUs (``expects_gpu``) has sampled ``intervals``
    intervals, enough to tell, without ever reporting a GPU (``gpu_seen``)."""
    return expects_gpu and not gpu_seen and intervals >= NO_GPU_INTERVALS


def read_warning(label: str, problem: ReadProblem) -> str:
    """The warning for a node's reader that cannot read its writer's samples."""
    if problem.kind is Degradation.LOG_UNREADABLE:
        return (
            f"wandb's transaction log of the node writer on {label} cannot be read ({problem.detail}): that "
            "node's SM clock and ECC counts, and with them its slow-GPU and memory-error alerts, stop here "
            "(a damaged file, or a wandb release whose log format this version does not know)"
        )
    return (
        f"the samples of the node writer on {label} cannot be read ({problem.detail}): that node's "
        "health (table, straggler and GPU rules) has no new samples from it"
    )


def no_gpu_warning(label: str, hostname: str, ranks: tuple[int, ...], intervals: int) -> str:
    """The warning for a node whose ranks have GPUs and whose samples show none."""
    return (
        f"{label} (host {hostname or '?'}, {ranks_text(ranks)}) runs ranks that Ray gave GPUs, yet its "
        f"writer's samples show no GPU after {intervals} sampling intervals: wandb's NVIDIA monitor did "
        "not start there (no libnvidia-ml.so.1 in the container, NVIDIA's driver not loaded yet, or a GPU "
        "off the bus when the writer started: NVML then fails its lookup). Its GPU series "
        "and the GPU rules are missing for it, and the straggler rule judges it by its CPU share"
    )
