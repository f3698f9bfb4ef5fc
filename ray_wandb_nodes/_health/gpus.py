"""One run's GPUs: each GPU of the run's nodes, its latest values, the GPU rules applied to it
(slow, idle, memory errors, lost; each in a module of its own) and the ``gpus`` table. Plain
data in, plain data out; the monitor feeds it each node's summaries and ranks.

Every GPU is keyed by (node id, NVML index). The ranks on a GPU come from Ray's GPU ids of each
train worker, mapped to NVML indices (``_gpu_ids``: integer ids as indices, UUIDs through the
UUIDs the monitor reports); a worker whose ids cannot be mapped (a MIG device, a UUID not known
yet) leaves its node's GPUs without ranks, and its node is then judged by all of them.

The rules judge sample times, the node's own clock, never the driver's: the integer series come
a transaction-log block late, in batches, and a batch spanning the window is judged as such.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .._gpu_ids import nvml_indices
from .gpu_ecc import EccWatch, ecc_step
from .gpu_idle import idle_verdicts
from .gpu_lost import lost_step
from .gpu_slow import is_slow, others_medians
from .kinds import EventKind, GpuState
from .messages import NodeSummary
from .rule import NodeStreak, advance
from .table import gpu_rows

MIN_SAMPLES = 3


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
    ecc_c: float | None = None
    ecc_u: float | None = None
    # batches not judged yet: (start, end, samples, present); (start, end, samples, sm, ecc_c, ecc_u)
    floats: tuple[float, float, int, bool] | None = None
    ints: list[tuple[float, float, int, float | None, float | None, float | None]] = field(default_factory=list)
    slow: NodeStreak = field(default_factory=NodeStreak)
    idle: NodeStreak = field(default_factory=NodeStreak)
    lost: NodeStreak = field(default_factory=NodeStreak)
    ecc: EccWatch = field(default_factory=EccWatch)
    ecc_first: float | None = None

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
            lost.flagged or self.ecc.ever or slow.flagged or idle.flagged
            or slow.since is not None or idle.since is not None or lost.since is not None
        )  # fmt: skip


class GpuEvent(NamedTuple):
    """A GPU rule's verdict: ``gpu`` as it was then, the rule's ``kind``, and whether the GPU
    ``recovered`` from it (else it is flagged now). The live alert and the offline report's
    flag are both written from it (``alerts.gpu_finding``)."""

    gpu: Gpu
    kind: EventKind
    recovered: bool


@dataclass
class _NodeGpus:
    gpus: dict[int, Gpu] = field(default_factory=dict)
    float_t: float | None = None
    gpu_t: float | None = None  # the newest sample with GPU readings
    seq: int | None = None  # the writer's sampling intervals as of its last summary
    int_t: float | None = None
    uuids: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    rank_ids: dict[int, tuple[str, ...]] = field(default_factory=dict)  # rank -> Ray's GPU ids
    unmapped: tuple[int, ...] = ()  # ranks whose GPUs are not known


class GpuHealth:
    def __init__(self, threshold: float, window_s: float, min_samples: int = MIN_SAMPLES) -> None:
        self.threshold, self.window_s, self.min_samples = threshold, window_s, min_samples
        self._nodes: dict[str, _NodeGpus] = {}

    # feeding ------------------------------------------------------------------------------------
    def ranks(self, node_id: str, rank_ids: Mapping[int, Iterable[str]]) -> None:
        """The train ranks on a node now, each with its GPU ids as Ray names them."""
        node = self._nodes.setdefault(node_id, _NodeGpus())
        node.rank_ids = {r: tuple(ids) for r, ids in rank_ids.items()}
        self._map(node)

    def update(self, node_id: str, summary: NodeSummary) -> None:
        """A node's new summary: its GPUs' fresh values become batches to judge."""
        node = self._nodes.setdefault(node_id, _NodeGpus())
        info = summary.gpu_info
        if info is not None and info.uuids and info.uuids != node.uuids:
            node.uuids, node.models = info.uuids, info.models
            self._map(node)
        gpus, t = summary.gpus, summary.t
        # wandb sends the GPU readings as records of their own: samples read between the system
        # record and the GPU record of an interval hold no GPU at all, which says nothing. A GPU
        # is missing when its node's other GPUs report without it, or when none has for longer
        # than the window while the node samples on.
        silent = not gpus and (node.gpu_t is None or t - node.gpu_t <= self.window_s)
        if t != node.float_t and (gpus or node.gpus) and not silent:
            node.float_t = t
            if gpus:
                node.gpu_t = t
            # ``seq`` counts the writer's sampling intervals: those between two summaries count too
            seq = summary.seq
            count = seq - node.seq if seq is not None and node.seq is not None and seq > node.seq else None
            node.seq = seq if seq is not None else node.seq
            batch = (float(summary.t0), float(t), count or int(summary.n or 1))
            for index, values in gpus.items():
                gpu = node.gpus.get(index) or self._gpu(node_id, node, index)
                gpu.util, gpu.mem, gpu.temp = values.util, values.mem, values.temp
                gpu.power, gpu.limit = values.power, values.limit if values.limit is not None else gpu.limit
                # present while any of its series reports: a MIG GPU has no utilisation, and a
                # GPU whose utilisation read failed once is never asked for it again (see gpu_lost)
                gpu.floats = (*batch, any(v is not None for v in values))
            for index in node.gpus.keys() - gpus.keys():  # seen before, missing now
                node.gpus[index].floats = (*batch, False)
        for ints in summary.gpu_ints:  # oldest first; each judged in turn
            if node.int_t is None or ints.t > node.int_t:
                node.int_t = ints.t
                span = (float(ints.t0), float(ints.t), int(ints.n or 1))
                for index, read in ints.by.items():
                    gpu = self._gpu(node_id, node, int(index))
                    gpu.ints.append((*span, read.sm, read.ecc_c, read.ecc_u))

    def forget(self, node_id: str) -> None:
        """A node lost or left: its GPUs are no longer judged (its rows stay, as they were)."""
        node = self._nodes.get(node_id)
        if node is not None:
            for gpu in node.gpus.values():
                gpu.floats, gpu.ints = None, []

    # judging ------------------------------------------------------------------------------------
    def judge(self, live: set[str]) -> list[GpuEvent]:
        """Apply every GPU rule to the batches that came since the last call, for the GPUs of the
        ``live`` nodes; their verdicts."""
        events: list[GpuEvent] = []
        gpus = [g for n, node in self._nodes.items() if n in live for g in node.gpus.values()]
        w, m = self.window_s, self.min_samples
        for gpu in gpus:  # lost first: a lost GPU is never also slow or idle
            if gpu.floats is not None:
                start, end, samples, present = gpu.floats
                said = lost_step(gpu.lost, present, samples, start, end, w, m)
                if said is not None:
                    events.append(GpuEvent(gpu, EventKind.GPU_LOST, said is not GpuState.LOST))
                    if said is GpuState.LOST:
                        gpu.slow, gpu.idle = NodeStreak(), NodeStreak()
        events += self._judge_ints(gpus)
        alive = [g for g in gpus if not g.lost.flagged]
        utils = {id(g): g.util for g in alive if g.ranks and g.util is not None}
        fresh = [id(g) for g in alive if id(g) in utils and g.floats is not None and g.floats[3]]
        idle = idle_verdicts(utils, fresh) if fresh else {}
        for gpu in alive:
            if id(gpu) in idle and gpu.floats is not None and gpu.floats[3]:
                worse, gpu.idle.median = idle[id(gpu)]
                start, end, samples, _ = gpu.floats
                if advance(gpu.idle, worse, samples, start, end, w, m):
                    events.append(GpuEvent(gpu, EventKind.IDLE_GPU, not gpu.idle.flagged))
        for gpu in gpus:
            gpu.floats = None
        return events

    def _judge_ints(self, gpus: list[Gpu]) -> list[GpuEvent]:
        """The memory-error and slow rules on every integer batch since the last call, in order,
        each GPU's against the job's other GPUs as last seen (one median list a model a call)."""
        events: list[GpuEvent] = []
        w, m = self.window_s, self.min_samples
        alive = [g for g in gpus if not g.lost.flagged]
        pending = [g for g in alive if g.ints]
        if not pending:
            return events
        for gpu in pending:  # the latest clock of each GPU, for the others' medians
            gpu.sm = next((b[3] for b in reversed(gpu.ints) if b[3] is not None), gpu.sm)
        medians = others_medians({id(g): (g.model, g.util, g.sm) for g in alive}, [id(g) for g in pending])
        for gpu in pending:
            for start, end, samples, sm, ecc_c, ecc_u in gpu.ints:
                gpu.sm = sm if sm is not None else gpu.sm
                gpu.ecc_c = ecc_c if ecc_c is not None else gpu.ecc_c
                if ecc_u is not None:
                    gpu.ecc_u = ecc_u
                    if gpu.ecc_first is None:
                        gpu.ecc_first = ecc_u
                    if ecc_step(gpu.ecc, ecc_u, samples, start, end, w, m):
                        events.append(GpuEvent(_as_now(gpu), EventKind.GPU_MEMORY_ERRORS, False))
                gpu.slow.median = medians[id(gpu)]
                if advance(gpu.slow, is_slow(sm, gpu.slow.median, self.threshold), samples, start, end, w, m):
                    events.append(GpuEvent(_as_now(gpu), EventKind.SLOW_GPU, not gpu.slow.flagged))
            gpu.ints = []
        return events

    # what the node rule and the tables read -------------------------------------------------------
    def judged_indices(self, node_id: str) -> tuple[int, ...] | None:
        """The GPUs a node is judged by: those of its ranks (all when any rank's are unknown),
        less the suspect ones; None when the node has reported no GPU."""
        node = self._nodes.get(node_id)
        if node is None or not node.gpus:
            return None
        ranked = {i for i, g in node.gpus.items() if g.ranks}
        use = ranked if ranked and not node.unmapped else set(node.gpus)
        return tuple(sorted(i for i in use if not node.gpus[i].suspect))

    def model(self, node_id: str) -> str:
        node = self._nodes.get(node_id)  # the first GPU NVML named: one lost from the start has no name
        return next((m for m in node.models if m), "") if node else ""

    def not_ok(self, node_id: str) -> str:
        node = self._nodes.get(node_id)
        if node is None:
            return ""
        return ", ".join(f"GPU {i} {g.state}" for i, g in sorted(node.gpus.items()) if g.state is not GpuState.OK)

    def unmapped(self, node_id: str) -> tuple[int, ...]:
        node = self._nodes.get(node_id)
        return node.unmapped if node else ()

    def rows(self, names: Mapping[str, tuple[str, str]]) -> list[list[Any]]:
        """The ``gpus`` table of the nodes ``names`` names (node id -> (label, hostname))."""
        return gpu_rows(self.gpus_of(names), names)

    def gpus_of(self, node_ids: Iterable[str]) -> list[Gpu]:
        """Every GPU of these nodes (for the ``gpus`` table)."""
        wanted = set(node_ids)
        return [g for n, node in self._nodes.items() if n in wanted for g in node.gpus.values()]

    def seen_gpus(self, node_id: str) -> bool:
        """Whether the node has ever reported a GPU."""
        node = self._nodes.get(node_id)
        return node is not None and bool(node.gpus)

    # inside -----------------------------------------------------------------------------------------
    def _gpu(self, node_id: str, node: _NodeGpus, index: int) -> Gpu:
        gpu = node.gpus.get(index)
        if gpu is None:
            gpu = node.gpus[index] = Gpu(node_id, index)
            self._map(node)
        return gpu

    def _map(self, node: _NodeGpus) -> None:
        """Each GPU's model and ranks, from the monitor's GPU list and Ray's GPU ids."""
        by_index: dict[int, list[int]] = {}
        unmapped = []
        for rank, ids in sorted(node.rank_ids.items()):
            indices = nvml_indices(ids, node.uuids) if ids else None
            if indices is None:
                unmapped.append(rank)
            for i in indices or ():
                by_index.setdefault(i, []).append(rank)
        node.unmapped = tuple(unmapped)
        for i, gpu in node.gpus.items():
            gpu.ranks = tuple(by_index.get(i, ()))
            if i < len(node.models):
                gpu.model = node.models[i]


def _as_now(gpu: Gpu) -> Gpu:
    """``gpu`` as it is now, for an alert said later (its values and medians move on)."""
    return replace(gpu, slow=replace(gpu.slow), idle=replace(gpu.idle), lost=replace(gpu.lost))
