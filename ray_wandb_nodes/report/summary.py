"""Per-node summaries of offline (or any local) W&B runs, read from their transaction logs.

``load(folder)`` finds the runs in a folder (an offline run folder with its ``index.json``,
a folder of such folders, or any folder of ``.wandb`` files) and summarises, for every
node label: samples, time span, CPU and memory (mean, max), GPU utilisation and memory per
GPU, network rates; and it flags nodes far from the median of the others. ``render``
presents the result (text, JSON, PNG). A damaged file is reported with its error (file and
byte offset) while every other node is still summarised.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from .._wandb.txlog import RunLog, read_run
from .._wandb.writers import Role
from .gpu_flags import gpu_flags
from .walk import absent_writers, find_run_folders, identify, role_named, wandb_files

_GPU_UTIL = re.compile(r"^gpu\.(\d+)\.gpu$")
_GPU_MEM = re.compile(r"^gpu\.(\d+)\.memoryAllocated$")
# A node is flagged when its mean is this far from the median of the others: percentages
# by at least PCT_POINTS points and PCT_SHARE of the larger value; rates by RATE_FACTOR
# times and at least RATE_MIN bytes/s.
PCT_POINTS, PCT_SHARE = 20.0, 0.3
RATE_FACTOR, RATE_MIN = 3.0, 1 << 20
MIN_NODES_TO_FLAG = 3


@dataclass
class GpuSummary:
    index: int
    util_mean: float | None
    util_max: float | None
    mem_mean: float | None
    mem_max: float | None


@dataclass
class NodeSummary:
    label: str
    role: Role  # PRIMARY, NODE or RUN
    files: list[str] = field(default_factory=list)
    node_id: str | None = None
    workers: bool | None = None  # hosts train workers (from the index), None when unknown
    samples: int = 0
    start: float | None = None
    end: float | None = None
    cpu_mean: float | None = None
    cpu_max: float | None = None
    mem_mean: float | None = None
    mem_max: float | None = None
    gpus: list[GpuSummary] = field(default_factory=list)
    net_sent_bps: float | None = None
    net_recv_bps: float | None = None
    state: str | None = None  # from the index: written, collected, left-on-node, lost, empty
    errors: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    @property
    def span_s(self) -> float | None:
        return None if self.start is None or self.end is None else self.end - self.start

    @property
    def gpu_util_mean(self) -> float | None:
        return _mean([g.util_mean for g in self.gpus if g.util_mean is not None])

    @property
    def gpu_mem_mean(self) -> float | None:
        return _mean([g.mem_mean for g in self.gpus if g.mem_mean is not None])

    @property
    def net_bps(self) -> float | None:
        if self.net_sent_bps is None or self.net_recv_bps is None:
            return None
        return self.net_sent_bps + self.net_recv_bps


_HEALTH_TABLES = ("nodes", "ranks", "hangs")  # the plugin's own tables and their history keys


def _is_health_row(row: dict[str, Any]) -> bool:
    """A row of the plugin's own (the node table and straggler count, the ranks table and slow-rank
    keys, a hang's table; see _health), not of training; the transaction log flattens a table's
    reference into ``nodes/path``, ``nodes/_type``, ..."""
    return any(k.split("/", 1)[0] in _HEALTH_TABLES for k in row)


@dataclass
class RunReport:
    run_id: str
    folder: str
    project: str | None = None
    entity: str | None = None
    name: str | None = None
    exit_code: int | None = None
    history_rows: int = 0
    history_keys: list[str] = field(default_factory=list)
    nodes: list[NodeSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)  # the node-health alerts raised (index)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # the last ``ranks`` table logged (index)
    # label -> [(timestamp, values)], for charts (not in the JSON)
    series: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict, repr=False)

    @property
    def errors(self) -> list[str]:
        return [e for n in self.nodes for e in n.errors]


# loading -------------------------------------------------------------------------------------
def load(folder: str) -> list[RunReport]:
    """Every run in ``folder``, summarised per node."""
    reports: list[RunReport] = []
    for run_folder, index in find_run_folders(folder):
        files = wandb_files(run_folder)
        logs = [read_run(p, strict=False) for p in files]
        by_run: dict[str, list[RunLog]] = {}
        for log in logs:
            by_run.setdefault(identify(log, run_folder, index).run_id, []).append(log)
        if index is not None and not by_run:
            by_run[str(index.get("run_id"))] = []
        for run_id, run_logs in sorted(by_run.items()):
            reports.append(summarise(run_id, run_folder, run_logs, index))
    return reports


def summarise(run_id: str, folder: str, logs: list[RunLog], index: dict[str, Any] | None = None) -> RunReport:
    report = RunReport(run_id=run_id, folder=folder)
    idx = index or {}
    report.project, report.entity, report.name = idx.get("project"), idx.get("entity"), idx.get("name")
    report.exit_code = idx.get("exit_code")
    report.alerts = [a for a in idx.get("alerts") or [] if isinstance(a, dict)]
    report.ranks = _rank_rows(idx.get("ranks"))
    nodes: dict[str, NodeSummary] = {}
    worker_nodes = set(idx.get("worker_nodes") or [])
    for log in sorted(logs, key=lambda g: (g.start_time or 0.0, g.path)):
        who = identify(log, folder, index)
        writer, role = who.entry, who.role
        if role is Role.PRIMARY or (role is Role.RUN and log.history):
            report.history_rows += sum(not _is_health_row(row) for row in log.history)
            report.history_keys = sorted({*report.history_keys, *log.keys})
            report.project = report.project or log.project
            report.entity = report.entity or log.entity
            report.name = report.name or log.name
            if log.exit_code is not None and report.exit_code is None:
                report.exit_code = log.exit_code
        for label in who.labels:
            node = nodes.setdefault(label or "(unlabelled)", NodeSummary(label=label or "(unlabelled)", role=role))
            if role is Role.PRIMARY:
                node.role = Role.PRIMARY
            node.files.append(os.path.relpath(log.path, folder))
            if writer:
                node.node_id = writer.get("node_id") or node.node_id
                node.state = writer.get("state") or node.state
            report.series.setdefault(node.label, []).extend(log.stats.get(label, []))
            if log.error is not None:
                node.errors.append(
                    f"{log.error} (the {sum(log.record_counts.values())} records before it are reported)"
                )
    for w in absent_writers(index, set(nodes)):
        label = w.get("label") or "?"
        node = NodeSummary(
            label=label, role=role_named(w.get("role"), Role.NODE), node_id=w.get("node_id"), state=w.get("state")
        )
        where = f" ({w['source']})" if w.get("source") else ""
        node.errors.append(f"no data here: {w.get('state')}{where}: {w.get('error') or 'unknown'}")
        nodes[label] = node
    for node in nodes.values():
        samples = report.series.setdefault(node.label, [])
        samples.sort(key=lambda s: s[0])  # once, here: the chart reads them in this order
        _fill(node, samples)
        if worker_nodes and node.node_id:
            node.workers = node.node_id in worker_nodes
    report.nodes = sorted(nodes.values(), key=lambda n: (n.role is not Role.PRIMARY, n.label))
    flag(report)
    by_gpu = gpu_flags(report.series, idx.get("health"))  # and each GPU, by the rules the live run applies
    for node in report.nodes:
        node.flags += by_gpu.get(node.label, [])
    return report


def _rank_rows(table: Any) -> list[dict[str, Any]]:
    """The index's last ``ranks`` table (``{"columns": [...], "rows": [[...], ...]}``) as one dict
    a row; nothing where the run logged none or the index holds something else."""
    if not isinstance(table, dict) or not isinstance(table.get("columns"), list):
        return []
    columns = [str(c) for c in table["columns"]]
    return [dict(zip(columns, row, strict=False)) for row in table.get("rows") or [] if isinstance(row, list)]


def _fill(node: NodeSummary, samples: list[tuple[float, dict[str, Any]]]) -> None:
    node.samples = len(samples)
    if not samples:
        return
    node.start, node.end = samples[0][0], samples[-1][0]

    def values(key: str) -> list[float]:
        return [float(v[key]) for _, v in samples if isinstance(v.get(key), (int, float))]

    node.cpu_mean, node.cpu_max = _mean(values("cpu")), _max(values("cpu"))
    node.mem_mean, node.mem_max = _mean(values("memory_percent")), _max(values("memory_percent"))
    gpu_ids = sorted({int(m[1]) for _, v in samples for k in v if (m := _GPU_UTIL.match(k) or _GPU_MEM.match(k))})
    for i in gpu_ids:
        util, mem = values(f"gpu.{i}.gpu"), values(f"gpu.{i}.memoryAllocated")
        node.gpus.append(GpuSummary(i, _mean(util), _max(util), _mean(mem), _max(mem)))
    node.net_sent_bps = _rate([(t, v.get("network.sent")) for t, v in samples])
    node.net_recv_bps = _rate([(t, v.get("network.recv")) for t, v in samples])


def _rate(points: list[tuple[float, Any]]) -> float | None:
    """Bytes per second from a cumulative counter (wandb's network.sent/recv)."""
    pts = [(t, float(v)) for t, v in points if isinstance(v, (int, float))]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return max(0.0, (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _max(xs: list[float]) -> float | None:
    return max(xs) if xs else None


# outliers ------------------------------------------------------------------------------------
def flag(report: RunReport) -> None:
    """Flag nodes far from the median of the others (among nodes with train workers, when known)."""
    nodes = [n for n in report.nodes if n.samples]
    what = "nodes"
    if any(n.workers for n in nodes):
        nodes, what = [n for n in nodes if n.workers], "nodes with train workers"
    if len(nodes) < MIN_NODES_TO_FLAG:
        if len(nodes) > 1:  # counts what it compares: the table above may list more nodes
            report.notes.append(
                f"this run has {len(nodes)} {what}: outliers are flagged among {MIN_NODES_TO_FLAG} or more"
            )
        return
    metrics: list[tuple[str, str, Any]] = [
        ("CPU", "pct", lambda n: n.cpu_mean),
        ("memory", "pct", lambda n: n.mem_mean),
        ("GPU utilisation", "pct", lambda n: n.gpu_util_mean),
        ("GPU memory", "pct", lambda n: n.gpu_mem_mean),
        ("network", "rate", lambda n: n.net_bps),
    ]
    for name, kind, get in metrics:
        for node in nodes:
            value = get(node)
            others = [v for n in nodes if n is not node and (v := get(n)) is not None]
            if value is None or len(others) < MIN_NODES_TO_FLAG - 1:
                continue
            median = statistics.median(others)
            if _far(value, median, kind):
                what = f"{value:.1f}% vs {median:.1f}%" if kind == "pct" else f"{_mbps(value)} vs {_mbps(median)}"
                node.flags.append(f"{name} {what} (median of the other {len(others)} nodes)")


def _far(value: float, median: float, kind: str) -> bool:
    diff = abs(value - median)
    if kind == "pct":
        return diff >= PCT_POINTS and diff >= PCT_SHARE * max(value, median)
    low, high = sorted((value, median))
    return diff >= RATE_MIN and (low == 0 or high / low >= RATE_FACTOR)


def _mbps(bps: float) -> str:
    return f"{bps / 1e6:.2f} MB/s"
