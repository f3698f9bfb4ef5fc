"""One run's GPUs: each GPU of the run's nodes, its latest values, the GPU rules applied to it
(slow, idle, memory errors, lost; each in a module of its own) and the ``gpus`` table. Plain
data in, plain data out; the monitor feeds it each node's summaries and ranks.

Every GPU is keyed by (node id, NVML index); what a node's summaries and ranks say of its GPUs is
its record's (``gpu_node``). Only the run's GPUs are judged and enter the medians (``judged``):
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
from dataclasses import replace
from operator import attrgetter
from typing import Any

from .._gpu_ids import GpuSlots
from .gpu import Gpu, GpuEvent
from .gpu_ecc import ecc_step
from .gpu_lost import lost_step
from .gpu_node import NodeGpus, judged
from .gpu_peers import GpuPeers
from .gpu_slow import is_slow
from .kinds import EventKind, GpuState
from .messages import NodeSummary
from .rule import NodeStreak, advance
from .table import gpu_rows

MIN_SAMPLES = 3
_ORDER = attrgetter("order")
SAVES_KEPT = 8  # checkpoint save spans kept for samples that come late (blocks, pings at scale)


class GpuHealth:
    def __init__(
        self, threshold: float, window_s: float, min_samples: int = MIN_SAMPLES, whole_nodes: bool = False
    ) -> None:
        self.threshold, self.window_s, self.min_samples = threshold, window_s, min_samples
        self.whole_nodes = whole_nodes  # a node without rank GPU ids is judged by all its GPUs
        self._nodes: dict[str, NodeGpus] = {}
        self._live: set[str] = set()  # the nodes judged, as the last ``judge`` said
        self._dirty: set[str] = set()  # nodes whose GPUs changed since the last ``judge``: what it looks at
        self._peers = GpuPeers()  # what the idle and slow rules compare each GPU with
        self._last_report: float | None = None
        self.awaits_report = False  # a node's ranks have not reported yet (the fleet tells the hooks: wants_report)
        self._saves: list[tuple[float, float]] = []  # the latest checkpoint saves' spans (report to report)

    # feeding ------------------------------------------------------------------------------------
    def ranks(self, node_id: str, rank_ids: Mapping[int, Iterable[str] | GpuSlots | None]) -> None:
        """The train ranks on a node now, each with its GPU ids as Ray names them, or its slots
        (a Tune trial's; None: not known)."""
        node = self._node(node_id)
        node.set_ranks(rank_ids)
        self.awaits_report |= bool(node.rank_ids) and node.first_report is None
        self._dirty.add(node_id)

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
        self._node(node_id).take(summary, arrived, self.window_s)
        self._dirty.add(node_id)

    def forget(self, node_id: str) -> None:
        """A node lost or left: its GPUs are no longer judged (its rows stay, as they were)."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.forget()

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

    def gpu_of_rank(self, node_id: str, rank: int) -> int | None:
        """The NVML index of the GPU ``rank`` holds on ``node_id`` (its first); None: none, or not known."""
        return min((g.index for g in self.gpus_of((node_id,)) if rank in g.ranks), default=None)

    def version(self, node_id: str) -> int:
        """Counts a node's changes: :meth:`judged_indices` and :meth:`model` say the same while it does."""
        node = self._nodes.get(node_id)
        return -1 if node is None else node.version

    def seen_gpus(self, node_id: str) -> bool:
        """Whether the node has ever reported a GPU."""
        node = self._nodes.get(node_id)
        return node is not None and bool(node.gpus)

    # inside -----------------------------------------------------------------------------------------
    def _node(self, node_id: str) -> NodeGpus:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = NodeGpus(node_id, order=len(self._nodes))
        return node

    def _changed(self, live: set[str]) -> list[tuple[NodeGpus, list[Gpu]]]:
        """The nodes changed since the last call (their summaries, ranks or GPUs, or joined or
        left ``live``), in the run's order, each with its judged GPUs (none unless live)."""
        if live != self._live:
            self._dirty |= (live ^ self._live) & self._nodes.keys()
            self._live = set(live)
        nodes = sorted((self._nodes[n] for n in self._dirty), key=_ORDER)
        self._dirty = set()
        return [(n, judged(n, self.whole_nodes) if n.node_id in self._live else []) for n in nodes]


def _as_now(gpu: Gpu) -> Gpu:
    """``gpu`` as it is now, for an alert said later (its values and medians move on)."""
    return replace(gpu, slow=replace(gpu.slow), idle=replace(gpu.idle), lost=replace(gpu.lost))
