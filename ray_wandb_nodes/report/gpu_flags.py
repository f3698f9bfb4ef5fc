"""The GPU rules over an offline run's samples: what the live run would have said of each GPU.

The node writers' transaction logs hold every sample (the integer series too), so the report
replays them, in time order across nodes, through the same rules the live run applies
(``_health.gpus``: slow, memory errors, lost; idle needs the ranks on each GPU, which an offline
folder does not record, so it is left out) with the run's ``straggler_threshold`` and
``straggler_window_s`` as the index names them (the defaults when it does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._health.alerts import gpu_alert
from .._health.gpus import IDLE_EV, GpuHealth
from .._health.summary import GPU_KEY, GPU_SERIES

_INTS = {"sm", "ecc_c", "ecc_u"}
DEFAULT_THRESHOLD, DEFAULT_WINDOW_S = 0.7, 120.0


def gpu_flags(
    series: Mapping[str, Sequence[tuple[float, Mapping[str, Any]]]], health: Mapping[str, Any] | None = None
) -> dict[str, list[str]]:
    """label -> what the GPU rules flagged on that node (one line each, as the alert says it)."""
    threshold = float((health or {}).get("threshold") or DEFAULT_THRESHOLD)
    window_s = float((health or {}).get("window_s") or DEFAULT_WINDOW_S)
    rules = GpuHealth(threshold, window_s)
    labels = set(series)
    flags: dict[str, list[str]] = {}
    samples = sorted((t, label, values) for label, points in series.items() for t, values in points)
    for t, label, values in samples:
        gpus: dict[int, dict[str, float]] = {}
        ints: dict[int, dict[str, float]] = {}
        for key, value in values.items():
            m = GPU_KEY.match(key)
            ours = GPU_SERIES.get(m[2]) if m else None
            if ours and isinstance(value, (int, float)) and not isinstance(value, bool):
                (ints if ours in _INTS else gpus).setdefault(int(m[1]), {})[ours] = float(value)  # type: ignore[index]
        if not gpus and not ints:
            continue
        summary: dict[str, Any] = {"t0": t, "t": t, "n": 1, "gpus": gpus}
        if ints:
            summary["gpu_ints"] = [{"t0": t, "t": t, "n": 1, "by": ints}]
        rules.update(label, summary)
        for gpu, kind, recovered in rules.judge(labels):
            if recovered or kind == IDLE_EV:
                continue
            alert = gpu_alert(
                gpu,
                kind,
                recovered,
                label=gpu.node_id,
                hostname="",
                node_ranks=(),
                unmapped=(),
                threshold=threshold,
                window_s=window_s,
            )
            # "GPU 3 (<model>) of <label> (host ?, no train workers) is slow: ..." -> "GPU 3 (<model>) is slow: ..."
            model = f" ({gpu.model})" if gpu.model else ""
            flags.setdefault(gpu.node_id, []).append(f"GPU {gpu.index}{model} {alert.text.split(') ', 1)[1]}")
    return flags
