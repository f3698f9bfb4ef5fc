"""Judging nodes against each other (pure): what value each node is compared by, the straggler
rules (by metric, GPU utilisation or CPU) applied to the nodes' fresh samples, and the words of
each node's alert. The monitor holds the nodes; this says what their values make of them.

Which value a node has:

- with ``metric`` set: the median, over the node's ranks, of that key of their latest reports
  (compared by ``mode``);
- without: the mean utilisation of the GPUs its ranks use (all its GPUs when which is not
  known), less the GPUs a GPU rule holds or is about to hold (one problem, one alert; see
  ``gpus``); or its CPU where it has no GPU (a high one is worse: the node doing more than the
  others is the one they wait for). Nodes are compared with nodes of the same GPU model, nodes
  without GPUs with each other; a node once seen with GPUs stays a GPU node (a MIG node reports
  no utilisation: it is then not compared, never judged by its CPU); differences under
  ``SYSTEM_FLOOR`` percentage points never count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from .._config.values import StragglerMode
from .._wandb.metrics import flatten
from .alerts import Alert, lost_alert, node_who, straggler_alert
from .gpus import GpuHealth
from .kinds import EventKind, NodeEnd
from .rule import NodeStreak, StragglerRule, judge
from .summary import gpu_util
from .tracked import TrackedNode

SYSTEM_FLOOR = 10.0  # percentage points
# A node seen gone this soon after its ranks went off it may have died with them (its death the
# cause of the restart that moved them: Train re-places ranks before the fleet sees the node
# dead). Ray knows a crashed node dead once its health checks fail: up to ~65 s at Ray's
# defaults (5 checks 3 s apart, 10 s each), plus the fleet's 3 s listing; a node ended on purpose
# (SIGTERM, a drain) at once, so the listing and Train's re-placement race alone. An autoscaler
# removes an idle node later (KubeRay after 60 s, then a drain or SIGTERM: past the 30 s; Ray's
# own after 5 min). One it drained as idle never died with ranks running.
LOST_GRACE_S = {NodeEnd.UNKNOWN: 70.0, NodeEnd.CRASHED: 70.0, NodeEnd.TERMINATED: 30.0, NodeEnd.PREEMPTED: 30.0}


def lost_when_gone(node: TrackedNode, end: NodeEnd, now: float, *, working: bool) -> bool:
    """Whether ``node``, seen gone from the cluster at ``now`` (ended as Ray says: ``end``), was
    lost with the run's work (an ERROR) rather than let go (``left``, no alert): it was
    ``working`` then (it held ranks; a Tune trial's node), or its ranks went off it within the
    grace of ``end``."""
    if working:
        return True
    grace, off_at = LOST_GRACE_S.get(end), node.ranks_off_at
    return bool(node.had_ranks) and off_at is not None and grace is not None and now - off_at < grace


class NodeJudge:
    """The straggler rules of one run, and the streak each node is on."""

    def __init__(self, metric: str | None, mode: StragglerMode, threshold: float, window_s: float) -> None:
        self.metric, self.threshold, self.window_s = metric, threshold, window_s
        self._metric_rule = StragglerRule(mode, threshold, window_s)
        self._gpu_rule = StragglerRule(StragglerMode.MAX, threshold, window_s, floor=SYSTEM_FLOOR)
        self._cpu_rule = StragglerRule(StragglerMode.MIN, threshold, window_s, floor=SYSTEM_FLOOR)
        self.streaks: dict[str, NodeStreak] = {}
        # each node's value and what it was made of (its GPUs' version, summaries taken, kind): a
        # node whose inputs did not change is not worked out again on every tick (one flat tuple
        # of atoms each, which the garbage collector does not track)
        self._values: dict[str, tuple[int, int, str | None, str, float | None]] = {}

    def median(self, node_id: str) -> float | None:
        """The other nodes' median at the node's last judged sample."""
        streak = self.streaks.get(node_id)
        return streak.median if streak else None

    def forget(self, node_id: str) -> None:
        self.streaks.pop(node_id, None)
        self._values.pop(node_id, None)

    def report(
        self, nodes: list[TrackedNode], metrics: list[Mapping[str, Any]], now: float
    ) -> list[tuple[str, EventKind]]:
        """One report of every rank (index = rank): the metric rule's events."""
        key = self.metric
        if key is None:
            return []
        values: dict[str, float] = {}
        for node in nodes:
            ranked = [_lookup(metrics[r], key) for r in node.ranks if r < len(metrics)]
            numbers = [v for v in ranked if v is not None]
            if numbers:
                node.metric = values[node.node_id] = statistics.median(numbers)
        return judge(self._metric_rule, self.streaks, values, dict.fromkeys(values, 1), now)

    def value(self, node: TrackedNode, gpus: GpuHealth) -> tuple[str, float | None]:
        """What the rule compares for ``node``: (``"gpu:<model>"``/``"cpu"``/the metric, value)."""
        if self.metric is not None:
            return self.metric, node.metric
        version, cached = gpus.version(node.node_id), self._values.get(node.node_id)
        if cached is not None and cached[:3] == (version, node.summaries, node.kind):
            return cached[3], cached[4]
        what, value = self._value(node, gpus)
        self._values[node.node_id] = version, node.summaries, node.kind, what, value
        return what, value

    def _value(self, node: TrackedNode, gpus: GpuHealth) -> tuple[str, float | None]:
        indices = gpus.judged_indices(node.node_id)
        if indices is not None or (node.kind or "").startswith("gpu"):
            mean, _ = gpu_util(node.summary, indices or ())
            return f"gpu:{gpus.model(node.node_id)}", mean
        cpu = node.summary.cpu if node.summary is not None else None
        return "cpu", float(cpu) if cpu is not None else None

    def system(self, compared: list[TrackedNode], gpus: GpuHealth, now: float) -> list[tuple[str, EventKind]]:
        """The system rule on the compared nodes' fresh samples: its events."""
        by_kind: dict[str, dict[str, float]] = {}
        judged = [(node, *self.value(node, gpus)) for node in compared]
        # GPU nodes by model, once every one's model is known (it comes with the first log block);
        # until then all together, rather than each alone in a group of its own.
        by_model = all(kind != "gpu:" for _, kind, _ in judged if kind.startswith("gpu:"))
        fresh: dict[str, int] = {}
        spans: dict[str, tuple[float, float] | None] = {}
        for node, kind, value in judged:
            base = kind.split(":")[0]
            if base != (node.kind or base).split(":")[0]:  # a CPU node turned GPU node: a new streak
                self.streaks.pop(node.node_id, None)
            node.kind = kind
            if value is not None:
                by_kind.setdefault(kind if by_model or base == "cpu" else "gpu:", {})[node.node_id] = value
                # Judged over the samples' own times (the node's clock, one node at a time): a
                # ping that brings samples spanning the window judges them at once.
                fresh[node.node_id] = node.fresh
                if node.fresh > 0:
                    spans[node.node_id] = node.span()
        events: list[tuple[str, EventKind]] = []
        for kind, values in by_kind.items():
            rule = self._cpu_rule if kind == "cpu" else self._gpu_rule
            counts = {n: fresh[n] for n in values if fresh[n] > 0}  # only nodes with fresh samples are judged
            if counts:
                events += judge(rule, self.streaks, values, counts, now, spans)
        return events

    def alert(self, node: TrackedNode, kind: EventKind, gpus: GpuHealth, now: float) -> Alert:
        """The alert of a node event (``STRAGGLER``, ``RECOVERED`` or ``NODE_LOST``)."""
        who = node_who(node.label, node.hostname, node.ranks or node.had_ranks)
        if kind is EventKind.NODE_LOST:
            return lost_alert(node.label, who, node.age(now))
        what, value = self.value(node, gpus)
        rule = self._metric_rule if self.metric is not None else self._cpu_rule if what == "cpu" else self._gpu_rule
        bound = f"{self.threshold:g} x" if rule.mode.higher_is_better else f"1/{self.threshold:g} x"
        return straggler_alert(
            node.label,
            who,
            kind,
            what=what,
            value=value,
            median=self.median(node.node_id),
            bound=bound,
            window_s=self.window_s,
        )


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
