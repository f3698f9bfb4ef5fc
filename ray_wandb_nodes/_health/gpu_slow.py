"""The slow-GPU rule (pure): a busy GPU whose SM clock stays low against its peers.

A GPU that throttles (heat, a power brake, a hardware slowdown) keeps reporting 100 %
utilisation while it runs at a fraction of its clock, so utilisation cannot tell it; its SM
clock can. A busy GPU (utilisation at least ``BUSY_UTIL``) is worse when its SM clock is below
``threshold`` x the median SM clock of the job's *other* busy GPUs of the same model (one model
boosts to other clocks than another; a model with a single busy GPU has nothing to compare
with). ``threshold`` is the run's ``straggler_threshold`` (0.7 by default): healthy GPUs of one
model running one job sit within a few percent of each other's clock, a throttled one far below.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from .._stats import median_without

K = TypeVar("K", bound=Hashable)
BUSY_UTIL = 50.0  # %: a GPU at least this busy is compared


def others_medians(
    gpus: Mapping[K, tuple[str, float | None, float | None]], only: Iterable[K] | None = None
) -> dict[K, float | None]:
    """``gpus``: key -> (model, utilisation, SM clock). For every busy GPU with a clock (of
    ``only``, when given), the median SM clock of the other busy GPUs of its model (one sorted
    list a model: O(log n) a GPU); None for a GPU not compared (idle, no clock, alone of its model)."""
    keys = list(gpus if only is None else only)
    by_model: dict[str, list[float]] = {}
    for model, util, sm in gpus.values():
        if is_busy(util, sm):
            by_model.setdefault(model, []).append(float(sm))  # type: ignore[arg-type]
    for clocks in by_model.values():
        clocks.sort()
    return {key: others_median(gpus[key][1], gpus[key][2], by_model.get(gpus[key][0], [])) for key in keys}


def others_median(util: float | None, sm: float | None, clocks: Sequence[float]) -> float | None:
    """One GPU's: the median of ``clocks`` (the sorted SM clocks of its model's busy GPUs, its
    own among them when busy) less its own ``sm``; None when it is not compared (idle, no clock,
    alone of its model)."""
    return median_without(clocks, float(sm)) if is_busy(util, sm) and len(clocks) >= 2 else None  # type: ignore[arg-type]


def is_slow(sm: float | None, median: float | None, threshold: float) -> bool:
    """Whether an SM clock is below ``threshold`` x the others' median (never without one)."""
    return sm is not None and median is not None and sm < threshold * median


def slow_verdicts(
    gpus: Mapping[K, tuple[str, float | None, float | None]], threshold: float
) -> dict[K, tuple[bool, float | None]]:
    """For every GPU of ``gpus`` (key -> (model, utilisation, SM clock)): (worse, the others'
    median SM clock); (False, None) for a GPU not compared."""
    medians = others_medians(gpus)
    return {key: (is_slow(gpus[key][2], median, threshold), median) for key, median in medians.items()}


def is_busy(util: float | None, sm: float | None) -> bool:
    """Whether a GPU with this utilisation and SM clock is compared (busy, with a clock)."""
    return util is not None and sm is not None and util >= BUSY_UTIL
