"""Reading a writer's recent samples into a summary: wandb keeps them per run
(``x_stats_buffer_size``), so no second sampler runs on the node."""

from __future__ import annotations

import time
from typing import Any

from .summary import summarize

# Samples wandb keeps per writer: enough for the reads between two pings at any interval.
BUFFER_SAMPLES = 16


class SummaryReader:
    """The latest summary of the samples a writer took since the previous read."""

    def __init__(self) -> None:
        self.summary: dict[str, Any] | None = None
        self._since: float | None = None
        self._seen = 0  # samples summarised so far: ``seq`` lets a reader count what it missed

    def read(self, run: Any) -> dict[str, Any] | None:
        """Read ``run``'s kept samples (a quick call to wandb's service); the latest summary."""
        try:
            series = run._system_metrics
        except Exception:  # noqa: BLE001 - an older or finished writer: keep what we have
            return self.summary
        fresh = summarize(series or {}, self._since)
        if fresh is not None:
            self._seen += fresh["n"]
            fresh["seq"] = self._seen
            self.summary, self._since = fresh, fresh["t"]
        return self.summary


def aged(summary: dict[str, Any] | None, now: float | None = None) -> dict[str, Any] | None:
    """``summary`` with ``age_s``: how old its newest sample is, on the clock that took it (the
    node's), so that the driver side never sets a node's sample time against its own clock."""
    if not summary or not isinstance(summary.get("t"), (int, float)):
        return summary
    now = time.time() if now is None else now
    return {**summary, "age_s": max(0.0, now - summary["t"])}
