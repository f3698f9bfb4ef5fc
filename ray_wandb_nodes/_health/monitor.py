"""One run's node health: its nodes, their latest summaries and rank values, and what is said
of them tick by tick. Plain data in, plain data out; no Ray, no wandb.

The fleet feeds it on its thread (nodes, summaries, which nodes are alive, rank reports) and
calls :meth:`HealthMonitor.tick`, which says which alerts to raise, whether the straggler count
changed, which warnings a degraded node needs, and, every ``table_every_s``, the tables' rows
(``node_tables``: their pace and what their rows need besides the nodes).
Nodes are judged against each other by ``node_judge`` (the straggler rules), each GPU on its own
against the job's others by ``gpus`` (slow, idle, memory errors, lost); ``table`` writes the
rows, ``alerts`` the words. A node that leaves the cluster with the run's ranks on it is lost.

Nodes without train workers (no ranks) are left out of the comparison unless ``compare_all``.

The run's ranks are judged too (``ranks``: fed each poll with every rank's step totals, judged
by the rank rule): its alerts, the ``ranks`` table and the history keys come with the tick, and
the node and GPU alerts it speaks for are held back (``claims``: one slow rank, one alert).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._config.values import StragglerMode
from .._gpu_ids import RankGpus
from .._steps import RankSteps, StepTotals
from .alert_groups import FlapHold, group_alerts
from .alerts import Alert, gpu_alert
from .claims import ClaimHold
from .degradation import no_gpu_warning, reports_no_gpu
from .gpus import GpuHealth
from .kinds import Degradation, EventKind, NodeEnd, NodeState
from .messages import NodeSummary
from .node_judge import NodeJudge, lost_when_gone
from .node_tables import NodeTables
from .ranks import HISTORY_EVERY_S, RankAt, RankHealth
from .table import COLUMNS, GPU_COLUMNS
from .tracked import TrackedNode

TABLE_EVERY_S = 60.0
HOLD_S = 300.0  # a GPU's recovery is said once it held this long: a flapping GPU is one episode
__all__ = ["COLUMNS", "GPU_COLUMNS", "Alert", "HealthMonitor", "HealthOptions", "NodeView", "Notice", "TickResult"]


@dataclass(frozen=True)
class HealthOptions:
    metric: str | None = None
    mode: StragglerMode = StragglerMode.MAX
    threshold: float = 0.7
    window_s: float = 120.0
    alerts: bool = True
    table_every_s: float = TABLE_EVERY_S
    hold_s: float = HOLD_S
    compare_all: bool = False  # compare every node of the run, with ranks or not (a Tune trial's)
    history_every_s: float = HISTORY_EVERY_S  # the slow-rank history keys at most this often (sampling interval)


class Notice(NamedTuple):
    """A warning about what node health cannot see of a node (said once by the fleet)."""

    node_id: str
    kind: Degradation
    text: str


class NodeView(NamedTuple):
    """A node as the monitor holds it now: ``sampled`` once a summary of it came."""

    node_id: str
    label: str
    hostname: str
    state: NodeState
    sampled: bool


@dataclass
class TickResult:
    alerts: list[Alert] = field(default_factory=list)
    stragglers: int | None = None  # the count, when it changed
    table: list[list[Any]] | None = None  # rows, when due
    gpu_table: list[list[Any]] | None = None  # the gpus table's rows, with the node table (GPUs seen)
    notices: list[Notice] = field(default_factory=list)  # degraded nodes, each once
    rank_table: list[list[Any]] | None = None  # the ranks table's rows, with the node table (ranks judged)
    rank_history: dict[str, float] | None = None  # the slow-rank history keys, when due


class HealthMonitor:
    def __init__(self, options: HealthOptions, clock: Any = time.time) -> None:
        self.options = o = options
        self._clock = clock
        self._nodes: dict[str, TrackedNode] = {}
        self._events: list[tuple[str, Alert]] = []  # (node id, its alert), said at the next tick
        self._judge = NodeJudge(o.metric, o.mode, o.threshold, o.window_s)
        self._stragglers = 0
        self._tables = NodeTables(o.table_every_s)
        self._hold = FlapHold(o.hold_s)
        self.raised: list[Alert] = []
        self.gpus = GpuHealth(o.threshold, o.window_s, whole_nodes=o.compare_all)
        self.ranks = RankHealth(o.threshold, o.window_s, o.history_every_s)
        self._claims = ClaimHold()

    # what the fleet feeds it ----------------------------------------------------------------------
    def set_nodes(
        self,
        nodes: Mapping[str, tuple[str, str]],
        ranks: Mapping[str, Iterable[int]],
        observed: Iterable[str] = (),
        rank_gpus: Mapping[int, RankGpus] | None = None,
    ) -> set[str]:
        """The run's nodes now (node id -> (label, hostname)), the ranks on each, and those only
        observed (past the run's writer cap: their series are not in the run); nodes that left
        stay in the table; ``rank_gpus``: each rank's GPU ids as Ray names them. Returns the
        nodes new to it."""
        self._tables.observed = set(observed)
        new = set()
        for node_id, (label, hostname) in nodes.items():
            node = self._nodes.get(node_id)
            if node is None:
                node = self._nodes[node_id] = TrackedNode(node_id, label, hostname)
                new.add(node_id)
            now_ranks = tuple(sorted(ranks.get(node_id, ())))
            if now_ranks or node.ranks:  # when they went off it (a restart, a resize): see lost_when_gone
                node.ranks_off_at = None if now_ranks else self._clock()
            node.ranks = now_ranks
            node.had_ranks = node.ranks or node.had_ranks
            # None: the rank's GPU ids are not known (judged as unmapped); (): it holds no GPU
            ids = {r: None if rank_gpus is None else rank_gpus.get(r, ()) for r in node.ranks}
            node.expects_gpu = any(ids.values())
            self.gpus.ranks(node_id, ids)
            node.in_run = not node.gone  # a node seen gone stays out, should the run still list it
            if node.state is NodeState.LEFT and not node.gone:
                node.state = NodeState.OK
        for node_id, node in self._nodes.items():
            if node_id not in nodes and node.in_run:
                if node.ranks:
                    node.ranks_off_at = self._clock()
                node.in_run, node.ranks = False, ()
                if node.state is not NodeState.LOST:
                    self._clear(node, NodeState.LEFT)
        return new

    def summary(self, node_id: str, summary: NodeSummary | None) -> None:
        """A node's latest summary (the same one again is ignored)."""
        node = self._nodes.get(node_id)
        if node is None or summary is None or node.state is NodeState.LOST:
            return
        t, ints_t, before = summary.t, summary.ints_t, node.summary
        if before is not None and t == before.t and ints_t == node.ints_t:
            return
        node.ints_t = ints_t
        self.gpus.update(node_id, summary, self._clock())
        node.summary, node.summaries = summary, node.summaries + 1
        if before is not None and t == before.t:
            return  # new integer GPU samples only: no new interval
        # ``seq`` counts the writer's intervals: those between two summaries count too
        seq, last = summary.seq, before.seq if before is not None else None
        new = seq - last if seq is not None and last is not None and seq > last else None
        if not node.fresh:
            node.fresh_t0 = summary.t0
        node.fresh += new or int(summary.n or 1)
        node.intervals += new or int(summary.n or 1)
        node.got = self._clock(), max(0.0, float(summary.age_s)) if summary.age_s is not None else 0.0

    def report(self, metrics: list[Mapping[str, Any]], now: float | None = None, checkpoint: bool = False) -> None:
        """One report of every rank (index = rank), ``checkpoint``: with one: judge the metric rule
        on it; the idle-GPU rule waits for the first and leaves out the save (see ``gpus``)."""
        now = self._clock() if now is None else now
        self.gpus.reported(now, checkpoint)
        self._said(self._judge.report(self._compared(), metrics, now), now)

    def rank_steps(
        self,
        steps: Mapping[int, StepTotals] | Iterable[RankSteps],
        at: Mapping[int, RankAt],
        now: float | None = None,
        gpus: bool = True,
        attempt: str | None = None,
    ) -> None:
        """Every rank's step points of the attempt ``attempt`` as their nodes read them (see
        ``ranks.RankHealth.read``), and where each rank of the run's current attempt runs;
        ``gpus``: the ranks are the run's own (their GPUs are the ones :meth:`set_nodes` mapped),
        not a Train run's inside a Tune trial."""
        self.ranks.read(
            steps, at, self._clock() if now is None else now, self.gpus.gpu_of_rank if gpus else None, attempt
        )

    def alive(self, alive: Iterable[str], now: float | None = None, ended: Mapping[str, NodeEnd] | None = None) -> None:
        """The cluster's alive nodes, and how Ray says the dead ones ended: a node gone with the run's
        ranks on it (or just off it, see ``lost_when_gone``) is lost (one alert); any other is
        ``left`` (no alert: an idle node an autoscaler removed, an observer). Judged once."""
        up = set(alive)
        now = self._clock() if now is None else now
        for node in self._nodes.values():
            if node.gone or node.node_id in up:
                continue
            node.gone = True
            end = (ended or {}).get(node.node_id, NodeEnd.UNKNOWN)
            working = bool(node.ranks) or (self.options.compare_all and node.in_run)  # a Tune trial's node
            if lost_when_gone(node, end, now, working=working):
                self._events.append((node.node_id, self._judge.alert(node, EventKind.NODE_LOST, self.gpus, now)))
                self._clear(node, NodeState.LOST)
            elif node.state is not NodeState.LEFT:
                node.in_run, node.ranks = False, ()
                self._clear(node, NodeState.LEFT)

    def tick(self, now: float | None = None, final: bool = False) -> TickResult:
        """Judge the system rule on fresh samples; the alerts, straggler count and table due."""
        now = self._clock() if now is None else now
        self._judge_gpus(now)
        if self.options.metric is None:
            self._said(self._judge.system(self._compared(), self.gpus, now), now)
        for node in self._nodes.values():
            node.fresh = 0
        out = TickResult(notices=self._notices())
        said: list[tuple[str, Alert]] = []
        for node_id, alert in [*self._events, *self._hold.due(now, final)]:
            node = self._nodes[node_id]
            if alert.kind is not EventKind.NODE_LOST and node.state in (NodeState.LOST, NodeState.LEFT):
                continue  # a node that died (or left) meanwhile is that, not a straggler or a bad GPU
            if alert.kind is EventKind.STRAGGLER:
                node.state = NodeState.STRAGGLER
            elif alert.kind is EventKind.RECOVERED:
                node.state = NodeState.OK
            said += self._claims.admit(node_id, alert, now, self.ranks)  # the rank rule's, or said
        self._events.clear()
        for node_id, alert in [*said, *self._claims.due(now, self.ranks, final)]:
            if alert.kind is EventKind.NODE_LOST or self._nodes[node_id].state not in (NodeState.LOST, NodeState.LEFT):
                out.alerts.append(alert)
        out.alerts = group_alerts(out.alerts)  # one cause, one alert: within the tick, so none waits
        out.alerts += self.ranks.take_alerts()  # grouped by cause already (rank_rule)
        out.rank_history = self.ranks.history(now, final)
        self.raised += out.alerts
        count = len(self.straggler_nodes())
        if count != self._stragglers:
            self._stragglers = out.stragglers = count
        if self._tables.due(now, final, alerted=bool(out.alerts)):
            out.table, out.gpu_table, out.stragglers = self.table(now), self.gpu_table(), count
            out.rank_table = self.ranks.rows() if self.ranks.measured else None
        return out

    def progress(self, ages: dict[str, float]) -> None:
        """Each node's oldest seconds since a rank's progress (hang detection reads the beacons)."""
        self._tables.progress(ages, self._clock())

    # what it holds --------------------------------------------------------------------------------
    def table(self, now: float | None = None) -> list[list[Any]]:
        """The ``nodes`` table's rows now."""
        now = self._clock() if now is None else now
        return self._tables.rows(self._nodes.values(), self._judge, self.gpus, now)

    def gpu_table(self) -> list[list[Any]] | None:
        """The ``gpus`` table's rows now (None: no GPU seen)."""
        return self.gpus.rows({n.node_id: (n.label, n.hostname) for n in self._nodes.values()}) or None

    def nodes(self) -> list[NodeView]:
        """Every node it holds, as it is now."""
        return [NodeView(n.node_id, n.label, n.hostname, n.state, n.summary is not None) for n in self._nodes.values()]

    @property
    def awaits_report(self) -> bool:
        """Whether the idle rule waits for the ranks' first report on a node (the run sends it)."""
        return self.gpus.awaits_report

    @property
    def stragglers(self) -> int:
        return self._stragglers

    def straggler_nodes(self) -> frozenset[str]:
        return frozenset(n.node_id for n in self._nodes.values() if n.state is NodeState.STRAGGLER)

    # inside ------------------------------------------------------------------------------------------
    def _compared(self) -> list[TrackedNode]:
        return [
            n
            for n in self._nodes.values()
            if n.state is not NodeState.LOST and n.in_run and (n.ranks or self.options.compare_all)
        ]

    def _judge_gpus(self, now: float) -> None:
        live = {n.node_id for n in self._nodes.values() if n.state not in (NodeState.LOST, NodeState.LEFT) and n.in_run}
        o = self.options
        for event in self.gpus.judge(live):
            node = self._nodes[event.gpu.node_id]
            alert = gpu_alert(
                event,
                label=node.label,
                hostname=node.hostname,
                node_ranks=node.ranks,
                unmapped=self.gpus.unmapped(node.node_id),
                threshold=o.threshold,
                window_s=o.window_s,
            )
            said = self._hold.admit((node.node_id, event.gpu.index, event.kind), node.node_id, alert, now)
            if said is not None:
                self._events.append((node.node_id, said))

    def _notices(self) -> list[Notice]:
        """A node whose ranks have GPUs and whose samples show none: said once."""
        out = []
        for node in self._nodes.values():
            if node.no_gpu_said or not node.in_run:
                continue
            if reports_no_gpu(node.expects_gpu, node.intervals, self.gpus.seen_gpus(node.node_id)):
                node.no_gpu_said = True
                text = no_gpu_warning(node.label, node.hostname, node.ranks, node.intervals)
                out.append(Notice(node.node_id, Degradation.NO_GPU, text))
        return out

    def _said(self, events: list[tuple[str, EventKind]], now: float) -> None:
        self._events += [(n, self._judge.alert(self._nodes[n], kind, self.gpus, now)) for n, kind in events]

    def _clear(self, node: TrackedNode, state: NodeState) -> None:
        node.state = state
        self._judge.forget(node.node_id)
        self.gpus.forget(node.node_id)
        self._hold.forget(node.node_id)
        self._claims.forget(node.node_id)
