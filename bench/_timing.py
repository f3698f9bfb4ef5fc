"""The cost of one call, for the micro-benchmarks of the hot paths."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def ns_per_call(fn: Callable[[], Any], calls: int, rounds: int = 1) -> float:
    """The median over ``rounds`` of the mean ns per call of ``calls`` calls of ``fn``."""
    per_round = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(per_round)
