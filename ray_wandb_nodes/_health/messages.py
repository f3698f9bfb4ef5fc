"""What a node writer's reader sends the driver side about its node: a summary of its latest
samples. Defined once here; built by ``summary``/``reader`` on the node, read by the monitor,
the GPU rules, the offline replay, the benchmarks and the tests' fakes.

A summary rides every status ping of the node's logger (1,000 nodes: 1,000 of them every ~47 s),
so it stays small and cheap to unpickle: the per-GPU values are NamedTuples (a tuple each, no
field names on the wire), the summary a slotted frozen dataclass pickled as one tuple.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .kinds import Degradation


class GpuSummary(NamedTuple):
    """One GPU's float readings over the fresh samples (wandb's kept samples, by NVML index).

    ``util``: utilisation, % (mean); ``mem``: memory allocated, % (mean); ``temp``: C (mean);
    ``power``: W (mean); ``limit``: the enforced power limit, W (the newest). None: not reported.
    """

    util: float | None = None
    mem: float | None = None
    temp: float | None = None
    power: float | None = None
    limit: float | None = None


class GpuInts(NamedTuple):
    """One GPU's integer readings of a transaction-log block: ``sm``, its mean SM clock (MHz);
    ``ecc_c``/``ecc_u``, its newest corrected and uncorrected ECC counts; ``busy_sm`` and
    ``busy_util``, the mean SM clock and utilisation of the block's samples that were busy (the
    clock and the utilisation of one sample, read together): what the slow rule judges; ``ecc_u0``,
    the uncorrected count of its oldest sample (a writer's first block: the baseline). None:
    not reported (``busy_*``: no busy sample in the block)."""

    sm: float | None = None
    ecc_c: float | None = None
    ecc_u: float | None = None
    busy_sm: float | None = None
    busy_util: float | None = None
    ecc_u0: float | None = None  # the uncorrected count of the block's oldest sample


class GpuIntBatch(NamedTuple):
    """The integer GPU series of the log blocks one read found: the samples' times (``t0``, ``t``,
    the node's clock), how many samples (``n``) and each GPU's values (``by``: NVML index ->)."""

    t0: float
    t: float
    n: int
    by: Mapping[int, GpuInts]


class GpuInventory(NamedTuple):
    """The node's GPUs as NVML lists them, by index: their models and UUIDs (read once), and
    the GPU ids Ray's workers there see (their raylet's ``CUDA_VISIBLE_DEVICES``; None: every
    GPU), by which a Tune trial's GPU slots are named (``_gpu_ids.slots_as_ids``)."""

    models: tuple[str, ...]
    uuids: tuple[str, ...]
    ray_ids: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """A node writer's latest samples, summarised on its node."""

    t0: float
    """When the oldest fresh sample was taken (epoch seconds, the node's clock)."""
    t: float
    """When the newest fresh sample was taken (the node's clock)."""
    n: int
    """How many sampling intervals the fresh samples span."""
    seq: int | None = None
    """The intervals this writer's reader has summarised so far: a gap between two summaries counts."""
    cpu: float | None = None
    """CPU of what the writer samples (%, the mean)."""
    mem: float | None = None
    """The node's memory in use (%, the mean)."""
    rss_mb: float | None = None
    """Resident memory of what the writer samples (MB, the mean)."""
    net_sent: float | None = None
    """Bytes the node sent (the newest counter)."""
    net_recv: float | None = None
    """Bytes the node received (the newest counter)."""
    gpus: Mapping[int, GpuSummary] = field(default_factory=dict)
    """Each GPU's float readings, by NVML index (empty: none in these samples)."""
    gpu_ints: tuple[GpuIntBatch, ...] = ()
    """The integer GPU series (SM clock, ECC counts) of the log blocks read lately, oldest first."""
    gpu_info: GpuInventory | None = None
    """The node's GPUs' models and UUIDs, once read."""
    age_s: float | None = None
    """How old ``t`` was when the summary was sent, on the node's clock (never set against another's)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # One tuple on the wire, rebuilt through __init__: a third cheaper to unpickle than
        # the slots' state dict (bench/health_cost.py's "summary in reply").
        return (NodeSummary, tuple(getattr(self, name) for name in NodeSummary.__slots__))

    @property
    def ints_t(self) -> float | None:
        """The newest integer GPU sample's time (None without)."""
        return max((b.t for b in self.gpu_ints), default=None)


class ReadProblem(NamedTuple):
    """What keeps a node's reader from its writer's samples: ``kind``; ``cause``, short and the
    same each time (one warning per node and cause); ``detail``, the error as it was raised."""

    kind: Degradation
    cause: str
    detail: str
