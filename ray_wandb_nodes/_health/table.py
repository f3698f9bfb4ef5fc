"""The ``nodes`` and ``gpus`` tables (pure): their columns, and their rows from the monitor's
nodes and GPUs as they are now."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .kinds import GpuState
from .summary import gpu_mem, gpu_util

if TYPE_CHECKING:
    from .gpu import Gpu
    from .tracked import TrackedNode

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
    "progress_age_s",
]
GPU_COLUMNS = [
    "node",
    "hostname",
    "gpu",
    "model",
    "ranks",
    "state",
    "util",
    "memory",
    "temp",
    "power_w",
    "power_limit_w",
    "sm_clock",
    "ecc_corrected",
    "ecc_uncorrected",
]
TABLE_CAP = 512  # rows of every GPU; past it, only the GPUs that are not ok, and one row counting the rest


def node_row(
    node: TrackedNode,
    *,
    observed: bool,
    age: float | None,
    value: float | None,
    median: float | None,
    gpus_not_ok: str,
    progress_age: float | None = None,
) -> list[Any]:
    """One node's row of the ``nodes`` table (``COLUMNS``); ``progress_age``: the seconds since
    the last progress of its least recent rank (None without hang detection)."""
    s = node.summary
    mean, low = gpu_util(s)
    return [
        node.label,
        node.hostname,
        ",".join(map(str, node.ranks)),
        node.state.value,
        "table only" if observed else "in run",
        _round(mean),
        _round(low),
        _round(gpu_mem(s)),
        _round(s.cpu if s else None),
        _round(s.mem if s else None),
        _round(s.rss_mb if s else None),
        _round(_mb(s.net_sent if s else None)),
        _round(_mb(s.net_recv if s else None)),
        _round(age),
        _round(value),
        _round(median),
        gpus_not_ok,
        _round(progress_age),
    ]


def node_order(nodes: Iterable[TrackedNode]) -> list[TrackedNode]:
    """The table's order: by lowest rank, then label (nodes without ranks last)."""
    return sorted(nodes, key=lambda n: (min(n.ranks, default=1 << 30), n.label))


def gpu_rows(gpus: list[Gpu], names: Mapping[str, tuple[str, str]]) -> list[list[Any]]:
    """The ``gpus`` table (node id -> (label, hostname) names the nodes): every GPU up to
    ``TABLE_CAP`` rows; past it the GPUs not ok, then one row that counts the others."""
    gpus = sorted(gpus, key=lambda g: (names[g.node_id][0], g.index))
    shown = gpus if len(gpus) <= TABLE_CAP else [g for g in gpus if g.state is not GpuState.OK][:TABLE_CAP]
    rows = [gpu_row(g, *names[g.node_id]) for g in shown]
    if len(shown) < len(gpus):
        listed = {id(g) for g in shown}
        rows.append([omitted_line([g for g in gpus if id(g) not in listed]), *[None] * (len(GPU_COLUMNS) - 1)])
    return rows


def omitted_line(omitted: list[Gpu]) -> str:
    """The row that counts the GPUs past the cap, by state: ``(600 more GPUs, all ok)``, or
    ``(88 more GPUs: 80 ok, 8 lost)`` when some of them are not ok (more of them than the cap)."""
    counts: dict[GpuState, int] = {}
    for g in omitted:
        counts[g.state] = counts.get(g.state, 0) + 1
    if set(counts) == {GpuState.OK}:
        return f"({len(omitted)} more GPUs, all ok)"
    states = ", ".join(f"{counts[state]} {state}" for state in GpuState if state in counts)  # the enum's order
    return f"({len(omitted)} more GPUs: {states})"


def gpu_row(g: Gpu, label: str, hostname: str) -> list[Any]:
    # A lost GPU reads nothing: no last readings shown as if current (its ECC counts stay).
    readings = (None,) * 6 if g.lost.flagged else (g.util, g.mem, g.temp, g.power, g.limit, g.sm)
    return [
        label,
        hostname,
        g.index,
        g.model,
        ",".join(map(str, g.ranks)),
        g.state.value,
        *(_round(v) for v in (*readings, g.ecc_c, g.ecc_u)),
    ]


def _mb(value: Any) -> float | None:
    return value / 1e6 if isinstance(value, (int, float)) else None


def _round(value: Any) -> float | None:
    return round(float(value), 2) if isinstance(value, (int, float)) else None
