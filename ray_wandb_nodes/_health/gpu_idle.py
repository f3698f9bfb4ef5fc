"""The idle-GPU rule (pure): a GPU that hosts a rank and does nothing while the others work.

A rank whose GPU sits near zero utilisation while the job's other ranks' GPUs are busy is
stuck (waiting on data, a hung collective on its side, work placed on the wrong device). Only
GPUs Ray assigned to a rank are judged: an unused GPU of a node is no problem. A GPU is worse
when its utilisation is at most ``IDLE_UTIL`` and the median of the *other* ranks' GPUs is at
least ``BUSY_UTIL`` (any model: idle is idle).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from .._stats import median_without
from .gpu_slow import BUSY_UTIL

K = TypeVar("K", bound=Hashable)
IDLE_UTIL = 5.0  # %: at most this is idle


def idle_verdicts(utils: Mapping[K, float], only: Iterable[K] | None = None) -> dict[K, tuple[bool, float | None]]:
    """``utils``: key -> utilisation of every GPU that hosts a rank. For each (of ``only``, when
    given): its :func:`idle_verdict`."""
    ordered = sorted(utils.values())
    return {key: idle_verdict(utils[key], ordered) for key in (utils if only is None else only)}


def idle_verdict(util: float, ordered: Sequence[float]) -> tuple[bool, float | None]:
    """One GPU's: (worse, the other ranks' GPUs' median utilisation). ``ordered``: the sorted
    utilisations of every GPU that hosts a rank, ``util`` among them; alone, a GPU is never idle."""
    if len(ordered) < 2:
        return False, None
    median = median_without(ordered, util)
    return util <= IDLE_UTIL and median >= BUSY_UTIL, median
