"""A node's latest samples in a few numbers (pure): what a node writer hands the driver side.

The input is what wandb keeps of a run's recent system metrics (``run._system_metrics`` with
``x_stats_buffer_size`` set): ``{key: [(datetime, value), ...]}``, keys unlabelled. The output
is bounded whatever the node: a handful of numbers and one list per GPU (at most ``MAX_GPUS``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_GPUS = 64
_GPU_KEY = re.compile(r"^gpu\.(\d+)\.(gpu|memoryAllocated)$")
# wandb's key -> ours, for the scalar parts
_SCALARS = {"cpu": "cpu", "memory_percent": "mem", "proc.memory.rssMB": "rss_mb"}
_COUNTERS = {"network.sent": "net_sent", "network.recv": "net_recv"}


def _epoch(t: Any) -> float | None:
    if isinstance(t, (int, float)):
        return float(t)
    stamp = getattr(t, "timestamp", None)
    return float(stamp()) if callable(stamp) else None


def summarize(series: Mapping[str, Sequence[tuple[Any, Any]]], since: float | None = None) -> dict[str, Any] | None:
    """The samples newer than ``since`` (epoch seconds), averaged per key; None when there are none.

    Returns ``t`` (the newest sample's time), ``n`` (how many samples), ``cpu`` (of what the
    writer samples), ``mem`` (the node's memory, %), ``rss_mb``, ``net_sent``/``net_recv`` (the
    newest counters, bytes), and per GPU ``gpu`` (utilisation, %) and ``gpu_mem`` (memory allocated, %).
    """
    times: set[float] = set()
    out: dict[str, Any] = {}
    gpus: dict[int, dict[str, float]] = {}
    for key, points in series.items():
        fresh = [(t, float(v)) for t, v in _points(points) if since is None or t > since]
        if not fresh:
            continue
        times.update(t for t, _ in fresh)
        if key in _COUNTERS:
            out[_COUNTERS[key]] = max(fresh)[1]
            continue
        mean = sum(v for _, v in fresh) / len(fresh)
        if key in _SCALARS:
            out[_SCALARS[key]] = mean
            continue
        m = _GPU_KEY.match(key)
        if m and int(m[1]) < MAX_GPUS:
            gpus.setdefault(int(m[1]), {})[m[2]] = mean
    if not times:
        return None
    out["t"] = max(times)
    out["n"] = len(times)
    if gpus:
        ids = sorted(gpus)
        out["gpu"] = [gpus[i].get("gpu") for i in ids]
        out["gpu_mem"] = [gpus[i].get("memoryAllocated") for i in ids]
    return out


def _points(points: Sequence[tuple[Any, Any]]) -> list[tuple[float, Any]]:
    out = []
    for point in points:
        try:
            t, v = point
        except (TypeError, ValueError):
            continue
        at = _epoch(t)
        if at is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append((at, v))
    return out


def gpu_util(summary: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """Mean and min GPU utilisation of a summary (None, None without GPUs)."""
    values = [v for v in (summary or {}).get("gpu") or [] if isinstance(v, (int, float))]
    if not values:
        return None, None
    return sum(values) / len(values), min(values)


def gpu_mem(summary: Mapping[str, Any] | None) -> float | None:
    values = [v for v in (summary or {}).get("gpu_mem") or [] if isinstance(v, (int, float))]
    return sum(values) / len(values) if values else None
