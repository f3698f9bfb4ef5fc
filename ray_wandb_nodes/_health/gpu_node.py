"""One node's GPUs as its summaries and its ranks tell them: each GPU's latest values and the
batches its rules judge next, the ranks on each GPU, and the node's clock placed on this one.
The rules across the run's GPUs are ``gpus``' (``GpuHealth``); a node's record knows only its own.

The ranks on a GPU come from Ray's GPU ids of each train worker, mapped to NVML indices
(``_gpu_ids``: integer ids as indices, UUIDs through the UUIDs the monitor reports).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .._gpu_ids import GpuSlots, RankGpus, as_ids, nvml_indices
from .gpu import Gpu
from .messages import NodeSummary


@dataclass
class NodeGpus:
    node_id: str
    gpus: dict[int, Gpu] = field(default_factory=dict)
    float_t: float | None = None
    gpu_t: float | None = None  # the newest sample with GPU readings
    seq: int | None = None  # the writer's sampling intervals as of its last summary
    int_t: float | None = None
    uuids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    ray_ids: tuple[str, ...] | None = None  # Ray's GPU ids on the node (None: every GPU)
    rank_ids: dict[int, RankGpus | None] = field(default_factory=dict)  # rank -> Ray's GPU ids or slots
    unmapped: tuple[int, ...] = ()  # ranks whose GPUs are not known
    first_report: float | None = None  # when its ranks (as they are now) first reported
    # What places its sample times on this clock: its latest summary's arrival here, less that
    # summary's newest sample's age when it arrived (a duration on the node's clock) and time.
    to_here: float = 0.0
    order: int = 0  # when first seen, among the run's nodes: its GPUs' verdicts come in this order
    version: int = 0  # counts the changes to its GPUs (what the node rule reads of them)

    def set_ranks(self, rank_ids: Mapping[int, Iterable[str] | GpuSlots | None]) -> None:
        """The train ranks on the node now, each with its GPU ids as Ray names them or slots (None: not known)."""
        new = {r: ids if ids is None or isinstance(ids, GpuSlots) else tuple(ids) for r, ids in rank_ids.items()}
        if new != self.rank_ids:  # other ranks (a restart): set-up again until they report
            self.rank_ids, self.first_report = new, None
        self.remap()

    def take(self, summary: NodeSummary, arrived: float | None, window_s: float) -> None:
        """A new summary: its GPUs' fresh values become batches to judge (see ``GpuHealth.update``).
        A GPU is missing when the node's other GPUs report without it, or when none has for
        longer than ``window_s`` while the node samples on."""
        self.version += 1
        if arrived is not None and summary.age_s is not None:
            self.to_here = arrived - (summary.t + summary.age_s)
        info = summary.gpu_info
        if info is not None and info.uuids and (info.uuids, info.ray_ids) != (self.uuids, self.ray_ids):
            self.uuids, self.models, self.ray_ids = info.uuids, info.models, info.ray_ids
            self.remap()
        gpus, t = summary.gpus, summary.t
        # wandb sends the GPU readings as records of their own: samples read between the system
        # record and the GPU record of an interval hold no GPU at all, which says nothing.
        silent = not gpus and (self.gpu_t is None or t - self.gpu_t <= window_s)
        if t != self.float_t and (gpus or self.gpus) and not silent:
            self.float_t = t
            if gpus:
                self.gpu_t = t
            # ``seq`` counts the writer's sampling intervals: those between two summaries count too
            seq = summary.seq
            count = seq - self.seq if seq is not None and self.seq is not None and seq > self.seq else None
            self.seq = seq if seq is not None else self.seq
            batch = (float(summary.t0), float(t), count or int(summary.n or 1))
            for index, values in gpus.items():
                gpu = self.gpu(index)
                gpu.util, gpu.mem, gpu.temp = values.util, values.mem, values.temp
                gpu.power, gpu.limit = values.power, values.limit if values.limit is not None else gpu.limit
                # present while any of its series reports: a MIG GPU has no utilisation, and a
                # GPU whose utilisation read failed once is never asked for it again (see gpu_lost)
                gpu.floats = (*batch, values.count(None) < len(values))
            for index in self.gpus.keys() - gpus.keys():  # seen before, missing now
                self.gpus[index].floats = (*batch, False)
        for ints in summary.gpu_ints:  # oldest first; each judged in turn
            if self.int_t is None or ints.t > self.int_t:
                self.int_t = ints.t
                span = (float(ints.t0), float(ints.t), int(ints.n or 1))
                for index, read in ints.by.items():
                    self.gpu(int(index)).ints.append((*span, read))

    def forget(self) -> None:
        """The node was lost or left: its GPUs are no longer judged (their rows stay, as they were)."""
        self.version += 1
        for gpu in self.gpus.values():
            gpu.floats, gpu.ints = None, []

    def gpu(self, index: int) -> Gpu:
        """The node's GPU ``index``, new ones added (with their model and ranks)."""
        gpu = self.gpus.get(index)
        if gpu is None:
            gpu = self.gpus[index] = Gpu(self.node_id, index)
            self.remap()
        return gpu

    def remap(self) -> None:
        """Each GPU's model and ranks, from the monitor's GPU list and Ray's GPU ids."""
        by_index: dict[int, list[int]] = {}
        unmapped = []
        for rank, given in sorted(self.rank_ids.items()):
            ids = as_ids(given, self.ray_ids, listed=bool(self.uuids))  # slots: named once the inventory came
            indices = None if ids is None else nvml_indices(ids, self.uuids) if ids else ()  # (): no GPU
            if indices is None:
                unmapped.append(rank)
            for i in indices or ():
                by_index.setdefault(i, []).append(rank)
        self.unmapped = tuple(unmapped)
        self.version += 1
        for i, gpu in self.gpus.items():
            gpu.ranks = tuple(by_index.get(i, ()))
            if i < len(self.models):
                gpu.model = self.models[i]


def judged(node: NodeGpus, whole_nodes: bool = False) -> list[Gpu]:
    """The GPUs of ``node`` that the run's rules judge and its medians take: those its ranks
    hold; all of them when a rank's ids cannot be mapped (which GPU it uses is not known), or, with
    ``whole_nodes``, when no rank of it is known; none when its ranks hold no GPU or it hosts
    no rank (another job's GPUs, on a shared node or one only observed)."""
    if node.unmapped or (whole_nodes and not node.rank_ids):
        return list(node.gpus.values())
    return [g for g in node.gpus.values() if g.ranks]
