"""Per-node summaries of offline (or any local) W&B runs, read from their transaction logs.

``load(folder)`` finds the runs in a folder (an offline run folder with its ``index.json``,
a folder of such folders, or any folder of ``.wandb`` files) and summarises, for every
node label: samples, time span, CPU and memory (mean, max), GPU utilisation and memory per
GPU, network rates; and it flags nodes far from the median of the others. ``format_text``,
``to_json`` and ``write_png`` present the result. A damaged file is reported with its error
(file and byte offset) while every other node is still summarised.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .index import INDEX, read_index
from .txlog import RunLog, read_run

_GPU_UTIL = re.compile(r"^gpu\.(\d+)\.gpu$")
_GPU_MEM = re.compile(r"^gpu\.(\d+)\.memoryAllocated$")
# A node is flagged when its mean is this far from the median of the others: percentages
# by at least PCT_POINTS points and PCT_SHARE of the larger value; rates by RATE_FACTOR
# times and at least RATE_MIN bytes/s.
PCT_POINTS, PCT_SHARE = 20.0, 0.3
RATE_FACTOR, RATE_MIN = 3.0, 1 << 20
MIN_NODES_TO_FLAG = 3
WIDTH = 100  # of the text report


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
    role: str  # primary, node, run
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
    # label -> [(timestamp, values)], for charts (not in the JSON)
    series: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict, repr=False)

    @property
    def errors(self) -> list[str]:
        return [e for n in self.nodes for e in n.errors]


# loading -------------------------------------------------------------------------------------
def find_run_folders(folder: str) -> list[tuple[str, dict[str, Any] | None]]:
    """``(run folder, index or None)`` for every run in ``folder``."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder!r} is not a folder; give an offline run folder (one holding {INDEX})")
    index = _read_index(folder)
    if index is not None:
        return [(folder, index)]
    nested = sorted(os.path.join(root, INDEX) for root, _, names in os.walk(folder) if INDEX in names)
    if nested:
        return [(os.path.dirname(p), _read_index(os.path.dirname(p))) for p in nested]
    if wandb_files(folder):
        return [(folder, None)]
    raise FileNotFoundError(
        f"no W&B runs in {folder!r}: it holds neither {INDEX} nor any .wandb file "
        "(offline runs of ray_wandb_nodes are in <dir>/ray_wandb_nodes/<run id>)"
    )


def wandb_files(folder: str) -> list[str]:
    """The ``.wandb`` files under ``folder``, not following links (wandb's ``latest-run`` is one)."""
    out: list[str] = []
    for root, _, names in os.walk(folder):
        out.extend(os.path.join(root, n) for n in names if n.endswith(".wandb"))
    return sorted(out)


def _read_index(folder: str) -> dict[str, Any] | None:
    try:
        return read_index(folder)
    except (OSError, ValueError) as e:
        path = os.path.join(folder, INDEX)
        raise ValueError(f"{path} cannot be read as JSON ({e}); it should be the index of an offline run") from None


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


def writer_for(path: str, folder: str, index: dict[str, Any] | None) -> dict[str, Any] | None:
    for w in (index or {}).get("writers", []):
        if w.get("path") and os.path.abspath(path).startswith(
            os.path.abspath(os.path.join(folder, w["path"])) + os.sep
        ):
            return dict(w)
    return None


@dataclass
class Writer:
    """Who wrote one transaction log: its run, role and labels, and its index entry if any."""

    run_id: str
    role: str  # primary, node, run
    labels: list[str]  # as in the file's keys ("" for unlabelled keys)
    entry: dict[str, Any] | None


def identify(log: RunLog, folder: str, index: dict[str, Any] | None) -> Writer:
    """The writer of ``log`` (a file under ``folder``): from the index when it names the file,
    else from the file itself (a file with history or config is a primary's)."""
    entry = writer_for(log.path, folder, index)
    run_id = log.run_id or (index or {}).get("run_id") or "unknown"
    role = (entry or {}).get("role") or ("primary" if log.history or log.config else "node")
    labels = log.labels or [(entry or {}).get("label") or os.path.basename(os.path.dirname(log.path))]
    return Writer(run_id=str(run_id), role=role, labels=labels, entry=entry)


def absent_writers(index: dict[str, Any] | None, present: set[str]) -> list[dict[str, Any]]:
    """The writers ``index`` names whose label has no file here (left on its node, lost, empty)."""
    return [w for w in (index or {}).get("writers", []) if (w.get("label") or "?") not in present]


def summarise(run_id: str, folder: str, logs: list[RunLog], index: dict[str, Any] | None = None) -> RunReport:
    report = RunReport(run_id=run_id, folder=folder)
    idx = index or {}
    report.project, report.entity, report.name = idx.get("project"), idx.get("entity"), idx.get("name")
    report.exit_code = idx.get("exit_code")
    nodes: dict[str, NodeSummary] = {}
    worker_nodes = set(idx.get("worker_nodes") or [])
    for log in sorted(logs, key=lambda g: (g.start_time or 0.0, g.path)):
        who = identify(log, folder, index)
        writer, role = who.entry, who.role
        if role == "primary" or (role == "run" and log.history):
            report.history_rows += len(log.history)
            report.history_keys = sorted({*report.history_keys, *(k for r in log.history for k in r)})
            report.project = report.project or log.project
            report.entity = report.entity or log.entity
            report.name = report.name or log.name
            if log.exit_code is not None and report.exit_code is None:
                report.exit_code = log.exit_code
        for label in who.labels:
            node = nodes.setdefault(label or "(unlabelled)", NodeSummary(label=label or "(unlabelled)", role=role))
            if role == "primary":
                node.role = "primary"
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
        node = NodeSummary(label=label, role=w.get("role") or "node", node_id=w.get("node_id"), state=w.get("state"))
        where = f" ({w['source']})" if w.get("source") else ""
        node.errors.append(f"no data here: {w.get('state')}{where}: {w.get('error') or 'unknown'}")
        nodes[label] = node
    for node in nodes.values():
        samples = report.series.setdefault(node.label, [])
        samples.sort(key=lambda s: s[0])  # once, here: the chart reads them in this order
        _fill(node, samples)
        if worker_nodes and node.node_id:
            node.workers = node.node_id in worker_nodes
    report.nodes = sorted(nodes.values(), key=lambda n: (n.role != "primary", n.label))
    flag(report)
    return report


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
    if any(n.workers for n in nodes):
        nodes = [n for n in nodes if n.workers]
    if len(nodes) < MIN_NODES_TO_FLAG:
        if len(nodes) > 1:
            report.notes.append(
                f"outliers are flagged among {MIN_NODES_TO_FLAG} or more nodes; this run has {len(nodes)}"
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


# output --------------------------------------------------------------------------------------
def _num(x: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _span(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}m"


def format_text(reports: list[RunReport]) -> str:
    lines: list[str] = []
    for r in reports:
        exit_text = "running or unknown" if r.exit_code is None else str(r.exit_code)
        lines.append(f"Run {r.run_id}  project={r.project or '-'}  exit code {exit_text}")
        lines.append(f"  folder  {r.folder}")
        keys = [k for k in r.history_keys if not k.startswith("_")]
        head = f"  history {r.history_rows} rows: "
        more = f", ... ({len(keys)} keys)"
        shown = ", ".join(keys)
        if len(head) + len(shown) > WIDTH:
            shown = shown[: WIDTH - len(head) - len(more)].rsplit(", ", 1)[0] + more
        lines.append(head + (shown or "-"))
        lines.append("")
        lines.append(
            f"  {'node':<28} {'role':<7} {'samples':>7} {'span':>6} {'CPU% mean/max':>13} "
            f"{'mem% mean/max':>13} {'net MB/s tx/rx':>14}"
        )
        for n in r.nodes:
            net = (
                "-"
                if n.net_sent_bps is None
                else f"{(n.net_sent_bps or 0) / 1e6:.2f}/{(n.net_recv_bps or 0) / 1e6:.2f}"
            )
            lines.append(
                f"  {n.label[:28]:<28} {n.role:<7} {n.samples:>7} {_span(n.span_s):>6} "
                f"{_num(n.cpu_mean) + '/' + _num(n.cpu_max):>13} {_num(n.mem_mean) + '/' + _num(n.mem_max):>13} "
                f"{net:>14}"
            )
            for g in n.gpus:
                lines.append(
                    f"  {'':<28} gpu{g.index:<4} util% {_num(g.util_mean)}/{_num(g.util_max)}  "
                    f"memory% {_num(g.mem_mean)}/{_num(g.mem_max)}"
                )
        gpu_less = all(not n.gpus for n in r.nodes)
        if gpu_less:
            lines.append("  (no GPU metrics: no node reported a GPU)")
        flagged = [(n.label, f) for n in r.nodes for f in n.flags]
        lines.append("")
        if flagged:
            lines.append("  Flagged (far from the other nodes):")
            lines.extend(f"    {label}: {f}" for label, f in flagged)
        else:
            lines.append("  Flagged: none")
        for note in r.notes:
            lines.append(f"  ({note})")
        errors = [(n.label, e) for n in r.nodes for e in n.errors]
        if errors:
            lines.append("  Errors:")
            lines.extend(f"    {label}: {e}" for label, e in errors)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def to_json(reports: list[RunReport]) -> dict[str, Any]:
    runs = []
    for r in reports:
        d = asdict(r)
        d.pop("series")
        for node, n in zip(d["nodes"], r.nodes, strict=True):
            node.update(span_s=n.span_s, gpu_util_mean=n.gpu_util_mean, gpu_mem_mean=n.gpu_mem_mean, net_bps=n.net_bps)
        d["errors"] = r.errors
        runs.append(d)
    return {"runs": runs}


Samples = list[tuple[float, dict[str, Any]]]
Points = Callable[[Samples], list[tuple[float, float]]]


def _points(get: Callable[[dict[str, Any]], Any]) -> Points:
    return lambda samples: [(t, float(y)) for t, v in samples if (y := get(v)) is not None]


# (title, a node's samples -> its points); the last panel (network) is drawn even when empty.
PANELS: list[tuple[str, Points]] = [
    ("CPU %", _points(lambda v: v.get("cpu"))),
    ("memory %", _points(lambda v: v.get("memory_percent"))),
    ("GPU utilisation % (mean of the node's GPUs)", _points(lambda v: _mean_of(v, _GPU_UTIL))),
    ("network MB/s (sent + received)", lambda samples: _net_rate_series(samples)),
]


def _mean_of(values: dict[str, Any], pattern: re.Pattern[str]) -> float | None:
    xs = [float(x) for k, x in values.items() if pattern.match(k) and isinstance(x, (int, float))]
    return _mean(xs)


def write_png(reports: list[RunReport], path: str) -> list[str]:
    """One PNG per run (``path``, then ``path`` with the run id for more runs); the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "--png needs matplotlib: pip install 'ray-wandb-nodes[report]' (or pip install matplotlib)"
        ) from None
    written = []
    for i, r in enumerate(reports):
        out = path if i == 0 else f"{os.path.splitext(path)[0]}-{r.run_id}.png"
        series = {label: s for label, s in r.series.items() if s}  # sorted by summarise
        t0 = min((s[0][0] for s in series.values()), default=0.0)
        span = max((s[-1][0] - t0 for s in series.values()), default=0.0)
        unit, scale = ("minutes", 60.0) if span >= 300 else ("seconds", 1.0)
        drawn = [(title, {label: points(s) for label, s in series.items()}) for title, points in PANELS]
        panels = [(t, by) for t, by in drawn[:-1] if any(by.values())] + drawn[-1:]
        fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)), sharex=True, squeeze=False)
        for ax, (title, by_label) in zip(axes[:, 0], panels, strict=True):
            for label, pts in by_label.items():
                if pts:
                    ax.plot([(t - t0) / scale for t, _ in pts], [y for _, y in pts], label=label, linewidth=1.4)
            ax.set_title(title, fontsize=10, loc="left")
            ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=8, loc="upper right")
        axes[-1, 0].set_xlabel(f"{unit} since the first sample")
        fig.suptitle(f"W&B run {r.run_id}: every node", fontsize=11)
        fig.tight_layout()
        fig.savefig(out, dpi=90)
        plt.close(fig)
        written.append(out)
    return written


def _net_rate_series(samples: list[tuple[float, dict[str, Any]]]) -> list[tuple[float, float]]:
    out = []
    prev: tuple[float, float] | None = None
    for t, v in samples:
        sent, recv = v.get("network.sent"), v.get("network.recv")
        if not isinstance(sent, (int, float)) or not isinstance(recv, (int, float)):
            continue
        total = float(sent) + float(recv)
        if prev is not None and t > prev[0]:
            out.append((t, max(0.0, total - prev[1]) / (t - prev[0]) / 1e6))
        prev = (t, total)
    return out
