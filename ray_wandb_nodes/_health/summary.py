"""A node's latest samples in a few numbers (pure): what a node writer hands the driver side.

Two inputs, both the writer's own (no second sampler runs on the node):

- what wandb keeps of a run's recent system metrics (``run._system_metrics`` with
  ``x_stats_buffer_size`` set): ``{key: [(datetime, value), ...]}``, keys unlabelled. wandb-core
  keeps only float-valued series there: per GPU utilisation, memory allocated, temperature,
  power and its limit;
- the integer-valued GPU series (SM clock, corrected and uncorrected ECC counts), which reach
  the run but not that buffer: they are read from the stats records of the writer's transaction
  log (``_wandb_log.LogTail``), which wandb-core writes a 32 KiB block at a time, so they
  arrive a block late (a few samples; see the README for how many).

(Each GPU's model and UUID come once from NVML when the writer starts: ``_gpu_ids``.)

The output (a :class:`~.messages.NodeSummary`) is bounded whatever the node: a handful of
numbers, and per GPU (at most ``MAX_GPUS``, by NVML index) five floats and three integers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .gpu_slow import BUSY_UTIL
from .messages import GpuIntBatch, GpuInts, GpuSummary, NodeSummary

MAX_GPUS = 64
GPU_KEY = re.compile(r"^gpu\.(\d+)\.(\w+)$")
# wandb's per-GPU float series -> ours (means of the fresh samples)
_GPU_FLOATS = {"gpu": "util", "memoryAllocated": "mem", "temp": "temp", "powerWatts": "power"}
_GPU_LAST = {"enforcedPowerLimitWatts": "limit"}
# wandb's per-GPU integer series (transaction log) -> ours: the SM clock averaged, counters at their newest
_GPU_INTS = {"smClock": "sm"}
_GPU_COUNTERS = {"correctedMemoryErrors": "ecc_c", "uncorrectedMemoryErrors": "ecc_u"}
# every per-GPU series the health rules read: wandb's name -> ours
GPU_SERIES = {**_GPU_FLOATS, **_GPU_LAST, **_GPU_INTS, **_GPU_COUNTERS}
# wandb's key -> ours, for the scalar parts
_SCALARS = {"cpu": "cpu", "memory_percent": "mem", "proc.memory.rssMB": "rss_mb"}
_COUNTERS = {"network.sent": "net_sent", "network.recv": "net_recv"}


def _epoch(t: Any) -> float | None:
    if isinstance(t, (int, float)):
        return float(t)
    stamp = getattr(t, "timestamp", None)
    return float(stamp()) if callable(stamp) else None


def summarize(series: Mapping[str, Sequence[tuple[Any, Any]]], since: float | None = None) -> NodeSummary | None:
    """The samples newer than ``since`` (epoch seconds), averaged per key; None when there are none.

    ``n`` counts the sampling intervals they span: the most points of any one series, since
    wandb sends the GPU readings as records of their own, at their own times (see
    :class:`~.messages.NodeSummary` for every field).
    """
    times: list[float] = []
    intervals = 0
    out: dict[str, Any] = {}
    gpus: dict[int, dict[str, float]] = {}
    for key, points in series.items():
        fresh = [(t, float(v)) for t, v in _points(points) if since is None or t > since]
        if not fresh:
            continue
        times += (fresh[0][0], fresh[-1][0])
        intervals = max(intervals, len(fresh))
        if key in _COUNTERS:
            out[_COUNTERS[key]] = max(fresh)[1]
            continue
        mean = sum(v for _, v in fresh) / len(fresh)
        if key in _SCALARS:
            out[_SCALARS[key]] = mean
            continue
        m = GPU_KEY.match(key)
        if m and int(m[1]) < MAX_GPUS:
            if m[2] in _GPU_FLOATS:
                gpus.setdefault(int(m[1]), {})[_GPU_FLOATS[m[2]]] = mean
            elif m[2] in _GPU_LAST:
                gpus.setdefault(int(m[1]), {})[_GPU_LAST[m[2]]] = max(fresh)[1]
    if not times:
        return None
    by_index = {i: GpuSummary(**gpus[i]) for i in sorted(gpus)}
    return NodeSummary(t0=min(times), t=max(times), n=intervals, gpus=by_index, **out)


def _points(points: Sequence[tuple[Any, Any]]) -> list[tuple[float, Any]]:
    out = []
    for point in points:
        try:
            t, v = point
        except (TypeError, ValueError):
            continue
        at = _epoch(t)
        if at is not None and _number(v):
            out.append((at, v))
    return sorted(out, key=lambda p: p[0])


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def gpu_ints(stats: Iterable[tuple[float, Mapping[str, Any]]]) -> GpuIntBatch | None:
    """The integer GPU series of some stats records (``(time, {key: value})``, keys unlabelled),
    or None without any: the mean SM clock and the newest ECC counts of each GPU, and the mean
    clock and utilisation of its busy samples (at least ``BUSY_UTIL`` in the same record: the
    clock of a sample is judged only with the utilisation of that sample, never a later one)."""
    by: dict[int, dict[str, list[tuple[float, float]]]] = {}
    busy: dict[int, list[tuple[float, float]]] = {}  # GPU -> (util, SM clock) of its busy samples
    for t, items in stats:
        record: dict[int, dict[str, float]] = {}
        for key, value in items.items():
            m = GPU_KEY.match(key)
            if not m or int(m[1]) >= MAX_GPUS or not _number(value):
                continue
            name = _GPU_INTS.get(m[2]) or _GPU_COUNTERS.get(m[2])
            if name:
                by.setdefault(int(m[1]), {}).setdefault(name, []).append((t, float(value)))
                record.setdefault(int(m[1]), {})[name] = float(value)
            elif m[2] == "gpu":
                record.setdefault(int(m[1]), {})["util"] = float(value)
        for i, values in record.items():
            util, sm = values.get("util"), values.get("sm")
            if util is not None and sm is not None and util >= BUSY_UTIL:
                busy.setdefault(i, []).append((util, sm))
    if not by:
        return None
    times = [t for series in by.values() for points in series.values() for t, _ in points]
    out: dict[int, GpuInts] = {}
    for i in sorted(by):
        values = {}
        for name, points in by[i].items():
            values[name] = sum(v for _, v in points) / len(points) if name == "sm" else max(points)[1]
        oldest = min(by[i].get("ecc_u", ()), default=None)
        if oldest is not None:
            values["ecc_u0"] = oldest[1]
        if busy.get(i):
            values["busy_util"] = sum(u for u, _ in busy[i]) / len(busy[i])
            values["busy_sm"] = sum(c for _, c in busy[i]) / len(busy[i])
        out[i] = GpuInts(**values)
    samples = max(len(points) for series in by.values() for points in series.values())
    return GpuIntBatch(min(times), max(times), samples, out)


def gpu_values(summary: NodeSummary | None, indices: Iterable[int] | None = None) -> dict[int, GpuSummary]:
    """The summary's GPUs (``indices`` only, when given): NVML index -> their values."""
    gpus = summary.gpus if summary is not None else {}
    if indices is None:
        return dict(gpus)
    wanted = set(indices)
    return {i: v for i, v in gpus.items() if i in wanted}


def gpu_util(summary: NodeSummary | None, indices: Iterable[int] | None = None) -> tuple[float | None, float | None]:
    """Mean and min utilisation of a summary's GPUs (``indices`` only), (None, None) without."""
    values = [float(v.util) for v in gpu_values(summary, indices).values() if v.util is not None and _number(v.util)]
    if not values:
        return None, None
    return sum(values) / len(values), min(values)


def gpu_mem(summary: NodeSummary | None, indices: Iterable[int] | None = None) -> float | None:
    values = [float(v.mem) for v in gpu_values(summary, indices).values() if v.mem is not None and _number(v.mem)]
    return sum(values) / len(values) if values else None
