"""The per-node reports of :mod:`.report` as text (at most ``WIDTH`` columns), JSON and PNG
charts (one line per node for CPU, memory, GPU utilisation, GPU memory and network; needs matplotlib)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .summary import _GPU_MEM, _GPU_UTIL, RunReport, _mean

WIDTH = 100  # of the text report


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
                f"  {n.label[:28]:<28} {n.role.value:<7} {n.samples:>7} {_span(n.span_s):>6} "
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
        if r.alerts:
            lines.append("  Alerts raised during the run:")
            lines.extend(
                f"    {_clock(a.get('time'))} {a.get('level', '?'):<5} {a.get('title')}: "
                + str(a.get("text")).replace("\n", "\n      ")  # a hang's alert has a line a stopped rank
                for a in r.alerts
            )
        else:
            lines.append("  Alerts raised during the run: none")
        lines.extend(_ranks_text(r.ranks))
        for note in r.notes:
            lines.append(f"  ({note})")
        errors = [(n.label, e) for n in r.nodes for e in n.errors]
        if errors:
            lines.append("  Errors:")
            lines.extend(f"    {label}: {e}" for label, e in errors)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# (column, heading, width) of the ranks table's text: the lines fit WIDTH with a 19-column node
_RANK_PARTS = [
    ("step_ms", "step", 7),
    ("input_ms", "input", 7),
    ("compute_ms", "compute", 8),
    ("comm_wait_ms", "wait", 7),
    ("optimizer_ms", "optim", 7),
    ("other_ms", "other", 7),
    ("lateness_ms", "late", 7),
]


def _ranks_text(rows: list[dict[str, Any]]) -> list[str]:
    """The run's last ``ranks`` table (ms a step over the last window judged; ``-`` where a part
    is not measured), or nothing where the run logged none."""
    if not rows:
        return []
    heads = "".join(f"{h:>{w}}" for _, h, w in _RANK_PARTS)
    lines = [
        "  Ranks (the last table logged, ms a step):",
        f"    {'rank':>4} {'node':<19} {'gpu':>3} {'steps':>6}{heads} state",
    ]
    for row in rows:
        if not isinstance(row.get("rank"), int):  # past the cap: the row counting the others
            lines.append(f"    {row.get('rank')}")
            continue
        parts = "".join(f"{_ms(row.get(c)):>{w}}" for c, _, w in _RANK_PARTS)
        node, gpu, steps = str(row.get("node") or "-")[:19], _num(row.get("gpu")), _num(row.get("steps"))
        lines.append(f"    {row['rank']:>4} {node:<19} {gpu:>3} {steps:>6}{parts} {row.get('state')}")
    return lines


def _ms(x: Any) -> str:
    """Milliseconds to a tenth, whole ones from a second (a column stays 6 wide)."""
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def _clock(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.gmtime(t))


def to_json(reports: list[RunReport]) -> dict[str, Any]:
    runs = []
    for r in reports:
        d = asdict(r)
        d.pop("series")
        for node, n in zip(d["nodes"], r.nodes, strict=True):
            node.update(
                role=n.role.value,
                span_s=n.span_s,
                gpu_util_mean=n.gpu_util_mean,
                gpu_mem_mean=n.gpu_mem_mean,
                net_bps=n.net_bps,
            )
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
    ("GPU memory allocated % (mean of the node's GPUs)", _points(lambda v: _mean_of(v, _GPU_MEM))),
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
