"""Order statistics the rules share (pure): the median of the other values, in O(log n)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def median_without(ordered: Sequence[float], value: float) -> float:
    """The median of sorted ``ordered`` less one occurrence of ``value`` (in it), in O(log n)."""
    skip = bisect.bisect_left(ordered, value)  # the others: ``ordered`` less index ``skip``
    half = (len(ordered) - 1) // 2
    upper = ordered[half if half < skip else half + 1]
    if (len(ordered) - 1) % 2:
        return upper
    return (ordered[half - 1 if half - 1 < skip else half] + upper) / 2
