"""Logging strategies and rank-metric reductions (pure functions over plain data).

| strategy | W&B runs                          | history from              | system metrics           |
|----------|-----------------------------------|---------------------------|--------------------------|
| shared   | one; node writers join it         | rank 0 (or ``rank_metrics``) | every node, one label each |
| main     | one                               | rank 0 (or ``rank_metrics``) | the primary's node only  |
| node     | one per node, grouped             | the lowest rank on the node | that node                |
| all      | one per rank, grouped             | that rank                 | the rank's node (its GPUs) |

What the run's code asks of a strategy (``_config.values.Strategy``): ``primary`` (shared,
main), ``node_writers`` and ``watches_hangs`` (shared), ``runs_per`` (node: ``NODE``, all:
``RANK``; :func:`plan_runs` plans those runs).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._config.values import RankMetrics, RunsPer
from .._ray import Placement
from .metrics import RowBuilder, flatten, number, to_row
from .naming import LABELS

_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class PlannedRun:
    """A W&B run of the node or all strategy (``runs_per``), hosted by the logger actor of ``node_id``."""

    run_id: str
    name: str
    node_id: str
    label: str  # the x_label of its system metrics
    rank: int  # whose metrics it logs
    gpu_ids: tuple[str, ...] = ()  # the rank's GPUs as Ray names them (mapped on its node)


def child_run_id(base_id: str, suffix: str) -> str:
    """``<base>-<suffix>``, kept under W&B's id length with a hash when needed."""
    run_id = _ID_SAFE.sub("-", f"{base_id}-{suffix}")
    if len(run_id) <= 64:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{run_id[:53]}-{digest}"


def plan_runs(runs_per: RunsPer, placements: Sequence[Placement], base_id: str) -> list[PlannedRun]:
    """The runs of the ``node`` and ``all`` strategies for one worker-group placement.

    ``NODE`` (``node``): one run per node, named for its label, logging the lowest rank on the
    node. ``RANK`` (``all``): one run per rank, ``rank-<r>``, hosted on the rank's node and
    sampling the rank's own GPUs. Ids depend on the label or rank only, so restarts write to the
    same runs.
    """
    if runs_per is RunsPer.NODE:
        lowest: dict[str, Placement] = {}
        for p in sorted(placements, key=lambda p: p.rank):
            lowest.setdefault(p.node_id, p)
        runs = []
        labels = LABELS.assign((p.hostname, p.node_id) for p in placements)
        for p in sorted(lowest.values(), key=lambda p: p.rank):
            label = labels[p.node_id]
            runs.append(
                PlannedRun(run_id=child_run_id(base_id, label), name=label, node_id=p.node_id, label=label, rank=p.rank)
            )
        return runs
    return [
        PlannedRun(
            run_id=child_run_id(base_id, f"rank-{p.rank}"),
            name=f"rank-{p.rank}",
            node_id=p.node_id,
            label=f"rank-{p.rank}",
            rank=p.rank,
            gpu_ids=p.gpu_ids,
        )
        for p in sorted(placements, key=lambda p: p.rank)
    ]


def combine_ranks(metrics: Sequence[Mapping[str, Any]], mode: RankMetrics) -> dict[str, Any]:
    """One history row from every rank's report.

    ``RANK0``: rank 0's metrics. ``ALL``: ``rank_<r>/key`` for every rank and key.
    ``REDUCE``: for every numeric key, ``key/mean``, ``/min``, ``/max``, ``/std`` (population)
    and ``/argmax_rank``, ``/argmin_rank`` over the ranks that reported it, so a straggler
    shows in one chart; other keys as rank 0 reported them.
    """
    if mode is RankMetrics.RANK0:
        return dict(metrics[0]) if metrics else {}
    flat = [flatten(m) for m in metrics]
    if mode is RankMetrics.ALL:
        return {f"rank_{r}/{k}": v for r, m in enumerate(flat) for k, v in m.items()}
    keys: list[str] = []
    for m in flat:
        keys.extend(k for k in m if k not in keys)
    row: dict[str, Any] = {}
    for key in keys:
        values = [(r, number(m[key])) for r, m in enumerate(flat) if key in m]
        numeric = [(r, v) for r, v in values if v is not None]
        if len(numeric) != len(values) or not numeric:
            if key in flat[0]:
                row[key] = flat[0][key]
            continue
        nums = [v for _, v in numeric]
        mean = sum(nums) / len(nums)
        row[f"{key}/mean"] = mean
        row[f"{key}/min"] = min(nums)
        row[f"{key}/max"] = max(nums)
        row[f"{key}/std"] = math.sqrt(sum((v - mean) ** 2 for v in nums) / len(nums))
        row[f"{key}/argmax_rank"] = max(numeric, key=lambda rv: rv[1])[0]
        row[f"{key}/argmin_rank"] = min(numeric, key=lambda rv: rv[1])[0]
    return row


def report_rows(rank_metrics: RankMetrics, excludes: Sequence[str]) -> RowBuilder:
    """The row builder of a Train run's primary: one report (rank 0's dict, or every rank's
    dicts combined as ``rank_metrics`` says) becomes one history row."""

    def build(payload: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        metrics = payload if isinstance(payload, Mapping) else combine_ranks(payload, rank_metrics)
        row, skipped = to_row(metrics, excludes)
        return row, {}, skipped

    return build
