"""One run's node health: its nodes, their latest summaries and rank values, the straggler
rule, the node-lost rule, and the node table. Plain data in, plain data out; no Ray, no wandb.

The fleet feeds it on its thread (nodes, summaries, which nodes are alive, rank reports) and
calls :meth:`HealthMonitor.tick`, which says which alerts to raise, whether the straggler count
changed and, every ``table_every_s``, the table's rows. Which value a node has:

- with ``metric`` set: the median, over the node's ranks, of that key of their latest reports
  (compared by ``mode``);
- without: the mean utilisation of the GPUs its ranks use (all its GPUs when which is not
  known), less the GPUs a GPU rule holds or is about to hold (one problem, one alert; see
  ``gpus``); or its CPU where it has no GPU (a high one is worse: the node doing more than the
  others is the one they wait for). Nodes are compared with nodes of the same GPU model, nodes
  without GPUs with each other; a node once seen with GPUs stays a GPU node (a MIG node reports
  no utilisation: it is then not compared, never judged by its CPU); differences under
  ``SYSTEM_FLOOR`` percentage points never count.

Each GPU is also judged on its own against the job's other GPUs (``gpus``: slow, idle, memory
errors, lost), and the ``gpus`` table is due with the node table.

Nodes without train workers (no ranks) are left out of the comparison unless ``compare_all``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._metrics import flatten
from .alerts import Alert, gpu_alert, ranks_text
from .gpus import GPU_COLUMNS, GpuHealth
from .rule import RECOVERED, STRAGGLER, NodeStreak, StragglerRule, judge
from .summary import gpu_mem, gpu_util

SYSTEM_FLOOR = 10.0  # percentage points
TABLE_EVERY_S = 60.0
# A node that dies this soon after the run moved off it was lost (Train restarts around a dead
# node, and may re-place its workers before the node is seen dead); later, it was let go.
LOST_GRACE_S = 120.0
OK, STRAGGLING, LOST, LEFT = "ok", "straggler", "lost", "left"
COLUMNS = [
    "node",
    "hostname",
    "ranks",
    "state",
    "series",
    "gpu_util_mean",
    "gpu_util_min",
    "gpu_mem",
    "cpu",
    "memory",
    "rss_mb",
    "net_sent_mb",
    "net_recv_mb",
    "last_sample_age_s",
    "value",
    "others_median",
    "gpus_not_ok",
]
__all__ = ["COLUMNS", "GPU_COLUMNS", "Alert", "HealthMonitor", "HealthOptions", "TickResult"]


@dataclass(frozen=True)
class HealthOptions:
    metric: str | None = None
    mode: str = "max"
    threshold: float = 0.7
    window_s: float = 120.0
    alerts: bool = True
    table_every_s: float = TABLE_EVERY_S
    compare_all: bool = False  # compare every node of the run, with ranks or not (a Tune trial's)


@dataclass
class TickResult:
    alerts: list[Alert] = field(default_factory=list)
    stragglers: int | None = None  # the count, when it changed
    table: list[list[Any]] | None = None  # rows, when due
    gpu_table: list[list[Any]] | None = None  # the gpus table's rows, with the node table (GPUs seen)


@dataclass
class _Node:
    node_id: str
    label: str
    hostname: str
    ranks: tuple[int, ...] = ()
    summary: dict[str, Any] | None = None
    fresh: int = 0  # system samples not judged yet
    metric: float | None = None
    state: str = OK
    in_run: bool = True
    left_at: float | None = None
    had_ranks: tuple[int, ...] = ()  # its last ranks (a lost node's alert); empty: it never hosted one
    got: tuple[float, float] | None = None  # its summary's arrival (this clock), and age then (the node's)
    kind: str | None = None  # what the system rule compares it as ("gpu:<model>", "cpu"), sticky for GPUs
    ints_t: float | None = None  # the newest integer GPU samples of its summary
    fresh_t0: Any = None  # when its oldest sample not judged yet was taken (the node's clock)


class HealthMonitor:
    def __init__(self, options: HealthOptions, clock: Any = time.time) -> None:
        self.options = o = options
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self._streaks: dict[str, NodeStreak] = {}
        self._events: list[tuple[str, Alert]] = []  # (node id, its alert), said at the next tick
        self._metric_rule = StragglerRule(o.mode, o.threshold, o.window_s)
        self._gpu_rule = StragglerRule("max", o.threshold, o.window_s, floor=SYSTEM_FLOOR)
        self._cpu_rule = StragglerRule("min", o.threshold, o.window_s, floor=SYSTEM_FLOOR)
        self._stragglers = 0
        self._observed: set[str] = set()
        self._table_at: float | None = None
        self.raised: list[Alert] = []
        self.gpus = GpuHealth(o.threshold, o.window_s)

    # what the fleet feeds it ----------------------------------------------------------------------
    def set_nodes(
        self,
        nodes: Mapping[str, tuple[str, str]],
        ranks: Mapping[str, Iterable[int]],
        observed: Iterable[str] = (),
        rank_gpus: Mapping[int, Iterable[str]] | None = None,
    ) -> set[str]:
        """The run's nodes now (node id -> (label, hostname)), the ranks on each, and those only
        observed (past the run's writer cap: their series are not in the run); nodes that left
        stay in the table; ``rank_gpus``: each rank's GPU ids as Ray names them. Returns the
        nodes new to it."""
        self._observed = set(observed)
        new = set()
        for node_id, (label, hostname) in nodes.items():
            node = self._nodes.get(node_id)
            if node is None:
                node = self._nodes[node_id] = _Node(node_id, label, hostname)
                new.add(node_id)
            node.ranks = tuple(sorted(ranks.get(node_id, ())))
            node.had_ranks = node.ranks or node.had_ranks
            self.gpus.ranks(node_id, {r: (rank_gpus or {}).get(r, ()) for r in node.ranks})
            node.in_run, node.left_at = True, None
            if node.state == LEFT:
                node.state = OK
        for node_id, node in self._nodes.items():
            if node_id not in nodes and node.in_run:
                node.in_run, node.ranks, node.left_at = False, (), self._clock()
                if node.state != LOST:
                    self._clear(node, LEFT)
        return new

    def summary(self, node_id: str, summary: Mapping[str, Any] | None) -> None:
        """A node's latest summary (the same one again is ignored)."""
        node = self._nodes.get(node_id)
        if node is None or not summary or node.state == LOST:
            return
        t, ints_t = summary.get("t"), max((b.get("t") or 0 for b in summary.get("gpu_ints") or ()), default=None)
        if node.summary is not None and t == node.summary.get("t") and ints_t == node.ints_t:
            return
        node.ints_t = ints_t
        self.gpus.update(node_id, summary)
        seq, before = summary.get("seq"), (node.summary or {}).get("seq")
        if node.summary is not None and t == node.summary.get("t"):
            node.summary = dict(summary)  # new integer GPU samples only: no new interval
            return
        # ``seq`` counts the writer's intervals: those between two summaries count too
        new = seq - before if isinstance(seq, int) and isinstance(before, int) and seq > before else None
        node.summary = dict(summary)
        if not node.fresh:
            node.fresh_t0 = summary.get("t0", t)
        node.fresh += new or int(summary.get("n") or 1)
        age = summary.get("age_s")
        node.got = self._clock(), max(0.0, float(age)) if isinstance(age, (int, float)) else 0.0

    def report(self, metrics: list[Mapping[str, Any]], now: float | None = None) -> None:
        """One report of every rank (index = rank): judge the metric rule on it."""
        key = self.options.metric
        if key is None:
            return
        values: dict[str, float] = {}
        for node in self._compared():
            ranked = [_lookup(metrics[r], key) for r in node.ranks if r < len(metrics)]
            numbers = [v for v in ranked if v is not None]
            if numbers:
                node.metric = values[node.node_id] = statistics.median(numbers)
        now = self._clock() if now is None else now
        self._said(judge(self._metric_rule, self._streaks, values, dict.fromkeys(values, 1), now))

    def alive(self, alive: Iterable[str], now: float | None = None) -> None:
        """The cluster's alive nodes: a node of the run (or just off it, having hosted ranks) not among them
        is lost (once); one that left never having hosted a rank (an idle cluster node) stays ``left``."""
        up = set(alive)
        now = self._clock() if now is None else now
        for node in self._nodes.values():
            if node.state == LOST or node.node_id in up:
                continue
            just_left = node.left_at is not None and now - node.left_at < LOST_GRACE_S and bool(node.had_ranks)
            if node.in_run or just_left:
                self._events.append((node.node_id, self._alert(node, LOST)))
                self._clear(node, LOST)

    def tick(self, now: float | None = None, final: bool = False) -> TickResult:
        """Judge the system rule on fresh samples; the alerts, straggler count and table due."""
        now = self._clock() if now is None else now
        self._judge_gpus()
        if self.options.metric is None:
            self._judge_system(now)
        out = TickResult()
        for node_id, alert in self._events:
            node = self._nodes[node_id]
            if alert.kind != LOST and node.state in (LOST, LEFT):
                continue  # a node that died (or left) meanwhile is that, not a straggler or a bad GPU
            if alert.kind == STRAGGLER:
                node.state = STRAGGLING
            elif alert.kind == RECOVERED:
                node.state = OK
            out.alerts.append(alert)
        self._events.clear()
        self.raised += out.alerts
        count = sum(n.state == STRAGGLING for n in self._nodes.values())
        if count != self._stragglers:
            self._stragglers = out.stragglers = count
        if self._table_at is None:
            self._table_at = now  # the first table one interval in (or at the end)
        # Due every table_every_s, at the end, and with every alert: the tables show what it says.
        if final or out.alerts or now - self._table_at >= self.options.table_every_s:
            self._table_at = now
            out.table = self.table(now)
            out.stragglers = count
            names = {n.node_id: (n.label, n.hostname) for n in self._nodes.values()}
            gpu_rows = self.gpus.rows(names)
            out.gpu_table = gpu_rows or None
        return out

    # the node table ---------------------------------------------------------------------------------
    def table(self, now: float | None = None) -> list[list[Any]]:
        now = self._clock() if now is None else now
        rows = []
        for node in sorted(self._nodes.values(), key=lambda n: (min(n.ranks, default=1 << 30), n.label)):
            s = node.summary or {}
            mean, low = gpu_util(s)
            streak = self._streaks.get(node.node_id)
            rows.append(
                [
                    node.label,
                    node.hostname,
                    ",".join(map(str, node.ranks)),
                    node.state,
                    "table only" if node.node_id in self._observed else "in run",
                    _round(mean),
                    _round(low),
                    _round(gpu_mem(s)),
                    _round(s.get("cpu")),
                    _round(s.get("mem")),
                    _round(s.get("rss_mb")),
                    _round(_mb(s.get("net_sent"))),
                    _round(_mb(s.get("net_recv"))),
                    _round(self._age(node, now)),
                    _round(self._value(node)[1]),
                    _round(streak.median if streak else None),
                    self.gpus.not_ok(node.node_id),
                ]
            )
        return rows

    @property
    def stragglers(self) -> int:
        return self._stragglers

    def straggler_nodes(self) -> frozenset[str]:
        return frozenset(n.node_id for n in self._nodes.values() if n.state == STRAGGLING)

    # inside ------------------------------------------------------------------------------------------
    def _compared(self) -> list[_Node]:
        return [
            n for n in self._nodes.values() if n.state != LOST and n.in_run and (n.ranks or self.options.compare_all)
        ]

    def _value(self, node: _Node) -> tuple[str, float | None]:
        """What the rule compares for ``node``: (``"gpu"``/``"cpu"``/the metric, value)."""
        if self.options.metric is not None:
            return self.options.metric, node.metric
        indices = self.gpus.judged_indices(node.node_id)
        if indices is not None or (node.kind or "").startswith("gpu"):
            mean, _ = gpu_util(node.summary, indices or ())
            return f"gpu:{self.gpus.model(node.node_id)}", mean
        cpu = (node.summary or {}).get("cpu")
        return "cpu", float(cpu) if isinstance(cpu, (int, float)) else None

    def _judge_system(self, now: float) -> None:
        by_kind: dict[str, dict[str, float]] = {}
        judged = [(node, *self._value(node)) for node in self._compared()]
        # GPU nodes by model, once every one's model is known (it comes with the first log block);
        # until then all together, rather than each alone in a group of its own.
        by_model = all(kind != "gpu:" for _, kind, _ in judged if kind.startswith("gpu:"))
        for node, kind, value in judged:
            base = kind.split(":")[0]
            if base != (node.kind or base).split(":")[0]:  # a CPU node turned GPU node: a new streak
                self._streaks.pop(node.node_id, None)
            node.kind = kind
            if value is not None:
                by_kind.setdefault(kind if by_model or base == "cpu" else "gpu:", {})[node.node_id] = value
        for kind, values in by_kind.items():
            fresh = {n: self._nodes[n].fresh for n in values}
            # Judged over the samples' own times (the node's clock, one node at a time): a ping
            # that brings samples spanning the window judges them at once.
            spans = {n: _span(self._nodes[n]) for n in values}
            rule = self._cpu_rule if kind == "cpu" else self._gpu_rule
            self._said(judge(rule, self._streaks, values, fresh, now, spans))
        for node in self._nodes.values():
            node.fresh = 0

    def _age(self, node: _Node, now: float) -> float | None:
        """``node``'s latest sample's age: as the node said on arrival, plus the time since (this clock)."""
        return None if node.got is None else node.got[1] + max(0.0, now - node.got[0])

    def _judge_gpus(self) -> None:
        live = {n.node_id for n in self._nodes.values() if n.state not in (LOST, LEFT) and n.in_run}
        o = self.options
        for gpu, kind, recovered in self.gpus.judge(live):
            node = self._nodes[gpu.node_id]
            alert = gpu_alert(
                gpu,
                kind,
                recovered,
                label=node.label,
                hostname=node.hostname,
                node_ranks=node.ranks,
                unmapped=self.gpus.unmapped(node.node_id),
                threshold=o.threshold,
                window_s=o.window_s,
            )
            self._events.append((node.node_id, alert))

    def _said(self, events: list[tuple[str, str]]) -> None:
        self._events += [(node_id, self._alert(self._nodes[node_id], kind)) for node_id, kind in events]

    def _clear(self, node: _Node, state: str) -> None:
        node.state = state
        self._streaks.pop(node.node_id, None)
        self.gpus.forget(node.node_id)

    def _alert(self, node: _Node, kind: str) -> Alert:
        o = self.options
        who = f"{node.label} (host {node.hostname or '?'}, {ranks_text(node.ranks or node.had_ranks)})"
        if kind == LOST:
            last = self._age(node, self._clock())
            age = f"; its last sample is {last:.0f}s old" if last is not None else ""
            return Alert(f"Node lost: {node.label}", f"{who} left the cluster{age}.", "ERROR", node.label, kind)
        what, value = self._value(node)
        name = "CPU (%)" if what == "cpu" else _gpu_name(what) if what.startswith("gpu:") else what
        streak = self._streaks.get(node.node_id)
        median = streak.median if streak else None
        figures = f"{name} {_fmt(value)}; the other nodes' median {_fmt(median)}"
        if kind == STRAGGLER:
            rule = self._metric_rule if o.metric is not None else self._cpu_rule if what == "cpu" else self._gpu_rule
            bound = f"{o.threshold:g} x" if rule.mode == "max" else f"1/{o.threshold:g} x"
            text = f"{who} is a straggler: {figures} (worse than {bound} that median for {o.window_s:g}s)."
            return Alert(f"Straggler: {node.label}", text, "WARN", node.label, kind)
        return Alert(f"Straggler recovered: {node.label}", f"{who} has recovered: {figures}.", "INFO", node.label, kind)


def _lookup(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if value is None and "/" in key:
        value = flatten(metrics).get(key)
    if value is None or isinstance(value, (bool, str)):
        return None
    if not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy and torch scalars
        except (TypeError, ValueError):
            return None
    return float(value) if math.isfinite(value) else None


def _span(node: _Node) -> tuple[float, float] | None:
    t0, t = node.fresh_t0, (node.summary or {}).get("t")
    if isinstance(t0, (int, float)) and isinstance(t, (int, float)):
        return float(t0), float(t)
    return None


def _gpu_name(kind: str) -> str:
    model = kind[len("gpu:") :]
    return f"GPU utilisation (%, {model})" if model else "GPU utilisation (%)"


def _mb(value: Any) -> float | None:
    return value / 1e6 if isinstance(value, (int, float)) else None


def _round(value: Any) -> float | None:
    return round(float(value), 2) if isinstance(value, (int, float)) else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
