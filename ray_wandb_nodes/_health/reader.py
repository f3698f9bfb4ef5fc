"""Reading a writer's recent samples into a summary: wandb keeps them per run
(``x_stats_buffer_size``), so no second sampler runs on the node; the integer GPU series and the
GPUs' models and UUIDs come from the writer's own transaction log (see ``summary``)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from .._gpu_ids import nvml_inventory
from .._wandb_log import LogTail, split_label
from .kinds import Degradation
from .messages import GpuIntBatch, GpuInventory, NodeSummary, ReadProblem
from .summary import gpu_ints, summarize

# Samples wandb keeps per writer: enough for the reads between two pings at any interval.
BUFFER_SAMPLES = 16
# A summary carries the integer GPU series of the log blocks read in the last RECENT_S (at most
# INT_BATCHES): enough for a ping every 3 s to see each, without resending old ones every ping.
INT_BATCHES, RECENT_S = 4, 10.0


class SummaryReader:
    """The latest summary of the samples a writer took since the previous read, and what kept
    it from reading them (``problems``: at most one a source, said by the driver side once)."""

    def __init__(self) -> None:
        self.summary: NodeSummary | None = None
        self._since: float | None = None
        self._seen = 0  # samples summarised so far: ``seq`` lets a reader count what it missed
        self._tail: LogTail | None = None
        # The integer GPU series of the newest log blocks, a batch each: a ping takes the latest
        # summary only, and blocks can complete faster than pings come.
        self._ints: list[tuple[float, GpuIntBatch]] = []  # (when read, the batch)
        self._info: GpuInventory | None = None  # the GPUs' models and UUIDs (read once, from NVML)
        self.problems: dict[Degradation, ReadProblem] = {}

    def read(self, run: Any) -> NodeSummary | None:
        """Read ``run``'s kept samples (a quick call to wandb's service) and the blocks its
        transaction log completed since the last read; the latest summary."""
        try:
            series = run._system_metrics
        except Exception:  # noqa: BLE001 - an older or finished writer: keep what we have
            return self.summary
        fresh = summarize(series or {}, self._since)
        logged = self._read_log(run)
        if fresh is not None:
            self._seen += fresh.n
            self.summary, self._since = replace(fresh, seq=self._seen), fresh.t
        if self.summary is not None and (fresh is not None or logged):
            now = time.monotonic()
            self._ints = [(at, b) for at, b in self._ints if now - at <= RECENT_S]
            self.summary = replace(self.summary, gpu_ints=tuple(b for _, b in self._ints), gpu_info=self._info)
        return self.summary

    def _read_log(self, run: Any) -> bool:
        """Take the integer GPU series from the log's new blocks (and, the first time, the GPUs'
        models and UUIDs); whether there was anything new."""
        new = False
        if self._tail is None:
            path = getattr(getattr(run, "settings", None), "sync_file", None)
            if not path:
                return False
            self._tail = LogTail(str(path))
            info = nvml_inventory()
            if info is not None:
                self._info = GpuInventory(tuple(info.get("models") or ()), tuple(info.get("uuids") or ()))
            new = self._info is not None
        stats = []
        for record in self._tail.read():
            if record.WhichOneof("record_type") == "stats":
                t = record.stats.timestamp.seconds + record.stats.timestamp.nanos / 1e9
                items = {
                    split_label(i.key or "/".join(i.nested_key))[0]: _json(i.value_json) for i in record.stats.item
                }
                stats.append((t, items))
        error = self._tail.error
        if error is not None:  # the tail stops there: said once, by the driver side
            self.problems[Degradation.LOG_UNREADABLE] = ReadProblem(
                Degradation.LOG_UNREADABLE, error.reason, str(error)
            )
        ints = gpu_ints(stats)
        if ints is not None:
            self._ints, new = [*self._ints, (time.monotonic(), ints)][-INT_BATCHES:], True
        return new


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def aged(summary: NodeSummary | None, now: float | None = None) -> NodeSummary | None:
    """``summary`` with ``age_s``: how old its newest sample is, on the clock that took it (the
    node's), so that the driver side never sets a node's sample time against its own clock."""
    if summary is None:
        return None
    now = time.time() if now is None else now
    return replace(summary, age_s=max(0.0, now - summary.t))
