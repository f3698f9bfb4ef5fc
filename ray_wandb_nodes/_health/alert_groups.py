"""Alerts grouped by cause, and a flapping GPU held to one alert and one recovery (pure).

One node-wide cause (a power brake, an NVML hang, a rack's cooling) gives every GPU of a node,
or the same verdict on many nodes, in one tick: :func:`group_alerts` says it once, the GPUs of
one node in one alert and many nodes with the same verdict in one alert listing them (counted
past ``LIST_LIMIT``). Grouping is within one tick only, so no alert waits for it.

A GPU near a threshold flips back and forth: :class:`FlapHold` says a GPU's recovery only once
it has stayed recovered for ``hold_s``; flagged again before that, it is the same episode and
says nothing (one alert and one recovery per episode)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

from .._hang import rank_ranges
from .alerts import Alert

LIST_LIMIT = 40  # nodes named in a grouped alert; past it, counted
TITLE_MAX = 63  # W&B's limit on an alert title: under 64 characters


def group_alerts(alerts: list[Alert]) -> list[Alert]:
    """``alerts`` of one tick, one alert per (verdict, node), then one per verdict of many nodes;
    in the order each verdict first came. A single GPU or node keeps its own alert as it was."""
    per_node: dict[tuple[object, ...], list[Alert]] = {}
    for a in alerts:
        key = (_verdict(a), a.node) if a.gpus else (_verdict(a), a.node, id(a))
        per_node.setdefault(key, []).append(a)
    nodes = [_one_node(group) for group in per_node.values()]
    by_verdict: dict[tuple[object, ...], list[Alert]] = {}
    for a in nodes:
        by_verdict.setdefault(_verdict(a), []).append(a)
    return [group[0] if len(group) == 1 else _many_nodes(group) for group in by_verdict.values()]


class FlapHold:
    """One GPU's episodes of each rule: a recovery is said once it held for ``hold_s`` (or at
    the run's end), a flag again within it is the episode going on (said nothing)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._pending: dict[Hashable, tuple[float, str, Alert]] = {}  # key -> (since, node id, recovery)

    def admit(self, key: Hashable, node_id: str, alert: Alert, now: float) -> Alert | None:
        """The alert to say now for this verdict of GPU ``key``; None: held, or the same episode."""
        if alert.recovered:
            self._pending[key] = (now, node_id, alert)
            return None
        if self._pending.pop(key, None) is not None:
            return None  # flagged again within the hold: the episode said so already
        return alert

    def due(self, now: float, final: bool = False) -> list[tuple[str, Alert]]:
        """The recoveries that held for ``hold_s`` (all of them at the run's end): (node id, alert)."""
        out = [(k, v) for k, v in self._pending.items() if final or now - v[0] >= self.hold_s]
        for key, _ in out:
            del self._pending[key]
        return [(node_id, alert) for _, (_, node_id, alert) in out]

    def forget(self, node_id: str) -> None:
        """A node lost or left: its pending recoveries are not said."""
        for key in [k for k, v in self._pending.items() if v[1] == node_id]:
            del self._pending[key]


def gpu_span(indices: tuple[int, ...]) -> str:
    """``0-7``, ``0,2,5-7``: GPU indices in short (as a hang verdict writes ranks)."""
    return rank_ranges(indices)


# inside -------------------------------------------------------------------------------------------
def _verdict(a: Alert) -> tuple[object, ...]:
    return a.kind, a.recovered, a.level, _prefix(a)


def _prefix(a: Alert) -> str:
    return a.title.split(": ", 1)[0]


def _subject(a: Alert) -> str:
    return a.title.split(": ", 1)[-1]


def _one_node(group: list[Alert]) -> Alert:
    """A node's GPUs with one verdict: ``<prefix>: <node> GPUs 0-7``, every GPU's own line."""
    if len(group) == 1:
        return group[0]
    first = group[0]
    indices = tuple(sorted(i for a in group for i in a.gpus))
    title = f"{_prefix(first)}: {first.node} GPUs {gpu_span(indices)}"
    if len(title) > TITLE_MAX:
        title = f"{_prefix(first)}: {first.node}, {len(indices)} GPUs"
    text = f"{len(indices)} GPUs of {first.node} at once:\n" + "\n".join(a.text for a in group)
    return replace(first, title=title[:TITLE_MAX], text=text, gpus=indices)


def _many_nodes(group: list[Alert]) -> Alert:
    """Many nodes with one verdict: ``<prefix>: <n> nodes[, <g> GPUs]``, each node named (up to
    ``LIST_LIMIT``, the rest counted) and the first node's alert in full."""
    first = group[0]
    count = sum(len(a.gpus) for a in group)
    of_gpus = f", {count} GPUs" if count else ""
    title = f"{_prefix(first)}: {len(group)} nodes{of_gpus}"
    shown, rest = group[:LIST_LIMIT], group[LIST_LIMIT:]
    lines = [f"{_prefix(first)} on {len(group)} nodes{of_gpus} at once:"]
    lines += [f"- {_subject(a)}" for a in shown]
    if rest:
        rest_gpus = sum(len(a.gpus) for a in rest)
        lines.append(f"- and {len(rest)} more nodes" + (f" ({rest_gpus} GPUs)" if rest_gpus else ""))
    lines.append(f"The first of them in full: {first.text}")
    node = f"{first.node}+{len(group) - 1}"
    return replace(first, title=title[:TITLE_MAX], text="\n".join(lines), node=node, gpus=())
