"""One run's GPUs: each GPU of the run's nodes, its latest values, the GPU rules applied to it
(slow, idle, memory errors, lost; each in a module of its own) and the ``gpus`` table. Plain
data in, plain data out; the monitor feeds it each node's summaries and ranks.

Every GPU is keyed by (node id, NVML index). The ranks on a GPU come from Ray's GPU ids of each
train worker, mapped to NVML indices (``_gpu_ids``: integer ids as indices, UUIDs through the
UUIDs the monitor reports). Only the run's GPUs are judged and enter the medians (:func:`judged`):
those its ranks hold; every GPU of a node whose ranks' ids cannot be mapped (a MIG device, a UUID
not known yet); none of a node whose ranks hold no GPU or that hosts no rank (a CPU-only job, an
observed node), unless ``whole_nodes`` (a Tune trial's nodes where it holds no GPU: a Train run
inside may use them). A Tune trial holding GPUs counts as rank 0 of its node, its GPUs given as
Ray's slots there (``GpuSlots``), named by the node's Ray GPU ids once its reader sent them.

The idle rule waits for the run's reports: no idle verdict on samples taken before a node's
ranks first reported (set-up: data, model download), nor during a checkpoint save the run's
reports show (from the report before the one carrying a checkpoint to that one). Reports are
timed on this process's clock and samples on their node's: a sample is placed on this clock by
its age, a duration on the node's clock (its summary's ``age_s`` when sent, plus how much older
than the summary's newest sample it is), counted back from the summary's arrival here. Two
hosts' clocks are never set against each other, so a node whose clock is off by minutes is
judged as one in step (a summary's time in transit places its samples that much later).

The rules judge sample times, the node's own clock, never the driver's: the integer series come
a transaction-log block late, in batches, and a batch spanning the window is judged as such.

A poll judges only the GPUs whose batches came since the last one; what each is compared with
(the other ranked GPUs' utilisations, the other busy GPUs' clocks of its model) is kept sorted as
it changes (``gpu_peers``), so a poll costs what changed, not the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from .._gpu_ids import GpuSlots, RankGpus, as_ids, nvml_indices
from .gpu import Gpu, GpuEvent
from .gpu_ecc import ecc_step
from .gpu_lost import lost_step
from .gpu_peers import GpuPeers
from .gpu_slow import is_slow
from .kinds import EventKind, GpuState
from .messages import NodeSummary
from .rule import NodeStreak, advance
from .table import gpu_rows

MIN_SAMPLES = 3
_ORDER = attrgetter("order")
SAVES_KEPT = 8  # checkpoint save spans kept for samples that come late (blocks, pings at scale)


@dataclass
class _NodeGpus:
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


class GpuHealth:
    def __init__(
        self, threshold: float, window_s: float, min_samples: int = MIN_SAMPLES, whole_nodes: bool = False
    ) -> None:
        self.threshold, self.window_s, self.min_samples = threshold, window_s, min_samples
        self.whole_nodes = whole_nodes  # a node without rank GPU ids is judged by all its GPUs
        self._nodes: dict[str, _NodeGpus] = {}
        self._live: set[str] = set()  # the nodes judged, as the last ``judge`` said
        self._dirty: set[str] = set()  # nodes whose GPUs changed since the last ``judge``: what it looks at
        self._peers = GpuPeers()  # what the idle and slow rules compare each GPU with
        self._last_report: float | None = None
        self.awaits_report = False  # a node's ranks have not reported yet (the fleet tells the hooks: wants_report)
        self._saves: list[tuple[float, float]] = []  # the latest checkpoint saves' spans (report to report)

    # feeding ------------------------------------------------------------------------------------
    def ranks(self, node_id: str, rank_ids: Mapping[int, Iterable[str] | GpuSlots | None]) -> None:
        """The train ranks on a node now, each with its GPU ids as Ray names them or slots (None: not known)."""
        node = self._node(node_id)
        new = {r: ids if ids is None or isinstance(ids, GpuSlots) else tuple(ids) for r, ids in rank_ids.items()}
        if new != node.rank_ids:  # other ranks (a restart): set-up again until they report
            node.rank_ids, node.first_report = new, None
        self.awaits_report |= bool(node.rank_ids) and node.first_report is None
        self._map(node)

    def reported(self, at: float, checkpoint: bool = False) -> None:
        """Every rank reported at ``at`` (Ray's report waits for all), ``checkpoint``: with one,
        saved since the report before (the save span the idle rule leaves out)."""
        for node in self._nodes.values():
            if node.rank_ids and node.first_report is None:
                node.first_report = at
        if checkpoint and self._last_report is not None:
            self._saves = [*self._saves[-(SAVES_KEPT - 1) :], (self._last_report, at)]
        self._last_report, self.awaits_report = at, False

    def update(self, node_id: str, summary: NodeSummary, arrived: float | None = None) -> None:
        """A node's new summary: its GPUs' fresh values become batches to judge. ``arrived``: when,
        on the clock the reports are timed on (with the summary's ``age_s``, it places the
        node's samples on that clock; without, they are taken as on it: this host's own writer)."""
        node = self._node(node_id)
        node.version += 1
        if arrived is not None and summary.age_s is not None:
            node.to_here = arrived - (summary.t + summary.age_s)
        self._dirty.add(node_id)
        info = summary.gpu_info
        if info is not None and info.uuids and (info.uuids, info.ray_ids) != (node.uuids, node.ray_ids):
            node.uuids, node.models, node.ray_ids = info.uuids, info.models, info.ray_ids
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
                gpu.floats = (*batch, values.count(None) < len(values))
            for index in node.gpus.keys() - gpus.keys():  # seen before, missing now
                node.gpus[index].floats = (*batch, False)
        for ints in summary.gpu_ints:  # oldest first; each judged in turn
            if node.int_t is None or ints.t > node.int_t:
                node.int_t = ints.t
                span = (float(ints.t0), float(ints.t), int(ints.n or 1))
                for index, read in ints.by.items():
                    gpu = self._gpu(node_id, node, int(index))
                    gpu.ints.append((*span, read))

    def forget(self, node_id: str) -> None:
        """A node lost or left: its GPUs are no longer judged (its rows stay, as they were)."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.version += 1
            for gpu in node.gpus.values():
                gpu.floats, gpu.ints = None, []

    # judging ------------------------------------------------------------------------------------
    def judge(self, live: set[str]) -> list[GpuEvent]:
        """Apply every GPU rule to the batches that came since the last call, for the GPUs of the
        ``live`` nodes; their verdicts. Only the nodes that changed are looked at."""
        nodes = self._changed(live)
        gpus = [g for _, mine in nodes for g in mine if g.floats is not None or g.ints]  # in the run's order
        events: list[GpuEvent] = []
        w, m = self.window_s, self.min_samples
        for gpu in gpus:  # lost first: a lost GPU is never also slow or idle
            if gpu.floats is not None:
                start, end, samples, present = gpu.floats
                said = lost_step(gpu.lost, present, samples, start, end, w, m)
                if said is not None:
                    events.append(GpuEvent(gpu, EventKind.GPU_LOST, said is not GpuState.LOST))
                    if said is GpuState.LOST:
                        gpu.slow, gpu.idle = NodeStreak(), NodeStreak()
        pending = [g for g in gpus if g.ints and not g.lost.flagged]
        # The latest busy clock of each GPU, for the others' medians. Each clock with the utilisation
        # of its own samples: a GPU idle for part of a block (a checkpoint save, a data stall) and
        # busy now is not judged by its idle, low clocks.
        for gpu in pending:
            busy = next((b[3] for b in reversed(gpu.ints) if b[3].busy_sm is not None), None)
            if busy is not None:
                gpu.busy_sm, gpu.busy_util = busy.busy_sm, busy.busy_util
        for node, mine in nodes:  # what each changed node adds to the comparisons now
            self._peers.node(node.node_id, [g for g in mine if not g.lost.flagged])
            node.version += 1  # the rules may change its GPUs' states
        events += self._judge_ints(pending)
        # the GPUs that ranks hold, with new readings
        fresh = [g for g in gpus if g.ranks and g.util is not None and not g.lost.flagged and g.floats and g.floats[3]]
        for gpu, (worse, gpu.idle.median) in zip(fresh, self._peers.idle(fresh), strict=True):
            start, end, samples, _ = gpu.floats  # type: ignore[misc]
            gpu.waiting = self._waited(gpu, start, end)
            if gpu.waiting:  # set-up or a checkpoint save: not idle, no verdict (nor a node's)
                gpu.waiting = worse
                if not gpu.idle.flagged:
                    gpu.idle.reset()
                continue
            if advance(gpu.idle, worse, samples, start, end, w, m):
                events.append(GpuEvent(gpu, EventKind.IDLE_GPU, not gpu.idle.flagged))
        for gpu in gpus:
            gpu.floats = None
        self._dirty |= {g.node_id for g in gpus if g.ints}  # a lost GPU's blocks wait
        return events

    def _judge_ints(self, pending: list[Gpu]) -> list[GpuEvent]:
        """The memory-error and slow rules on every integer batch of the ``pending`` GPUs (alive,
        judged), in order, each GPU's against the job's other GPUs as last seen."""
        events: list[GpuEvent] = []
        w, m = self.window_s, self.min_samples
        for gpu, median in zip(pending, self._peers.slow_medians(pending), strict=True):
            for start, end, samples, read in gpu.ints:
                sm, ecc_c, ecc_u = read.sm, read.ecc_c, read.ecc_u
                gpu.sm = sm if sm is not None else gpu.sm
                gpu.ecc_c = ecc_c if ecc_c is not None else gpu.ecc_c
                if ecc_u is not None:
                    gpu.ecc_u = ecc_u
                    if gpu.ecc_first is None:  # the baseline: the writer's first sample, not its first block's newest
                        gpu.ecc_first = read.ecc_u0 if read.ecc_u0 is not None else ecc_u
                        gpu.ecc.last = gpu.ecc_first
                    if ecc_step(gpu.ecc, ecc_u, samples, start, end, w, m):
                        events.append(GpuEvent(_as_now(gpu), EventKind.GPU_MEMORY_ERRORS, False))
                gpu.slow.median = median
                if read.busy_sm is not None:
                    gpu.busy_sm, gpu.busy_util = read.busy_sm, read.busy_util
                slow = is_slow(read.busy_sm, gpu.slow.median, self.threshold)
                if advance(gpu.slow, slow, samples, start, end, w, m):
                    events.append(GpuEvent(_as_now(gpu), EventKind.SLOW_GPU, not gpu.slow.flagged))
            gpu.ints = []
        return events

    def _waited(self, gpu: Gpu, start: float, end: float) -> bool:
        """Whether samples from ``start`` to ``end`` (the node's clock) were taken before the GPU's
        node's ranks first reported, or overlap a checkpoint save the reports show (this clock)."""
        node = self._nodes[gpu.node_id]
        start, end = start + node.to_here, end + node.to_here
        first = node.first_report
        return first is None or start < first or any(start < e and end > s for s, e in self._saves)

    # what the node rule and the tables read -------------------------------------------------------
    def judged_indices(self, node_id: str) -> tuple[int, ...] | None:
        """The GPUs a node is judged by: those of its ranks (all when any rank's are unknown, or
        it hosts no rank), less the suspect ones; None when the node has reported no GPU or its
        ranks hold none (a CPU-only job on a GPU node: judged by its CPU, not another job's GPUs)."""
        node = self._nodes.get(node_id)
        if node is None or not node.gpus:
            return None
        if node.rank_ids and not node.unmapped and not any(node.rank_ids.values()):
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

    def version(self, node_id: str) -> int:
        """Counts a node's changes: :meth:`judged_indices` and :meth:`model` say the same while it does."""
        node = self._nodes.get(node_id)
        return -1 if node is None else node.version

    def seen_gpus(self, node_id: str) -> bool:
        """Whether the node has ever reported a GPU."""
        node = self._nodes.get(node_id)
        return node is not None and bool(node.gpus)

    # inside -----------------------------------------------------------------------------------------
    def _node(self, node_id: str) -> _NodeGpus:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = _NodeGpus(node_id, order=len(self._nodes))
        return node

    def _gpu(self, node_id: str, node: _NodeGpus, index: int) -> Gpu:
        gpu = node.gpus.get(index)
        if gpu is None:
            gpu = node.gpus[index] = Gpu(node_id, index)
            self._map(node)
        return gpu

    def _changed(self, live: set[str]) -> list[tuple[_NodeGpus, list[Gpu]]]:
        """The nodes changed since the last call (their summaries, ranks or GPUs, or joined or
        left ``live``), in the run's order, each with its judged GPUs (none unless live)."""
        if live != self._live:
            self._dirty |= (live ^ self._live) & self._nodes.keys()
            self._live = set(live)
        nodes = sorted((self._nodes[n] for n in self._dirty), key=_ORDER)
        self._dirty = set()
        return [(n, judged(n, self.whole_nodes) if n.node_id in self._live else []) for n in nodes]

    def _map(self, node: _NodeGpus) -> None:
        """Each GPU's model and ranks, from the monitor's GPU list and Ray's GPU ids."""
        by_index: dict[int, list[int]] = {}
        unmapped = []
        for rank, given in sorted(node.rank_ids.items()):
            ids = as_ids(given, node.ray_ids, listed=bool(node.uuids))  # slots: named once the inventory came
            indices = None if ids is None else nvml_indices(ids, node.uuids) if ids else ()  # (): no GPU
            if indices is None:
                unmapped.append(rank)
            for i in indices or ():
                by_index.setdefault(i, []).append(rank)
        node.unmapped = tuple(unmapped)
        node.version += 1
        self._dirty.add(node.node_id)
        for i, gpu in node.gpus.items():
            gpu.ranks = tuple(by_index.get(i, ()))
            if i < len(node.models):
                gpu.model = node.models[i]


def judged(node: _NodeGpus, whole_nodes: bool = False) -> list[Gpu]:
    """The GPUs of ``node`` that the run's rules judge and its medians take: those its ranks
    hold; all of them when a rank's ids cannot be mapped (which GPU it uses is not known), or, with
    ``whole_nodes``, when no rank of it is known; none when its ranks hold no GPU or it hosts
    no rank (another job's GPUs, on a shared node or one only observed)."""
    if node.unmapped or (whole_nodes and not node.rank_ids):
        return list(node.gpus.values())
    return [g for g in node.gpus.values() if g.ranks]


def _as_now(gpu: Gpu) -> Gpu:
    """``gpu`` as it is now, for an alert said later (its values and medians move on)."""
    return replace(gpu, slow=replace(gpu.slow), idle=replace(gpu.idle), lost=replace(gpu.lost))
