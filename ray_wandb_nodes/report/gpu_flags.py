"""The GPU rules over an offline run's samples: what the live run would have said of each GPU.

The node writers' transaction logs hold every sample (the integer series too), so the report
replays them, in time order across nodes, through the same functions the live run applies: each
sample is summarised as a node's reader summarises its writer's (``summarize``, ``gpu_ints``),
judged by the same rules (``GpuHealth``: slow, memory errors, lost; idle needs the ranks on each
GPU, which an offline folder does not record, so it is left out), and each verdict written by
the same words as the live alert (``gpu_finding``), with the run's ``straggler_threshold`` and
``straggler_window_s`` as the index names them (the defaults when it does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._health import EventKind, GpuHealth, gpu_finding, gpu_ints, gpu_name, summarize

DEFAULT_THRESHOLD, DEFAULT_WINDOW_S = 0.7, 120.0


def gpu_flags(
    series: Mapping[str, Sequence[tuple[float, Mapping[str, Any]]]], health: Mapping[str, Any] | None = None
) -> dict[str, list[str]]:
    """label -> what the GPU rules flagged on that node (one line each, as the alert says it)."""
    threshold = float((health or {}).get("threshold") or DEFAULT_THRESHOLD)
    window_s = float((health or {}).get("window_s") or DEFAULT_WINDOW_S)
    rules = GpuHealth(threshold, window_s, whole_nodes=True)  # no ranks offline: every GPU of a node
    labels = set(series)
    flags: dict[str, list[str]] = {}
    samples = sorted(((t, label, values) for label, points in series.items() for t, values in points), key=_time)
    for t, label, values in samples:
        floats = summarize({k: [(t, v)] for k, v in values.items()})
        ints = gpu_ints([(t, values)])
        if floats is None or (not floats.gpus and ints is None):
            continue
        rules.update(label, replace(floats, gpu_ints=(ints,) if ints is not None else ()))
        for event in rules.judge(labels):
            if event.recovered or event.kind is EventKind.IDLE_GPU:
                continue
            finding = gpu_finding(event, threshold=threshold, window_s=window_s)
            flags.setdefault(event.gpu.node_id, []).append(f"{gpu_name(event.gpu)} {finding}")
    return flags


def _time(sample: tuple[float, str, Mapping[str, Any]]) -> tuple[float, str]:
    return sample[0], sample[1]
