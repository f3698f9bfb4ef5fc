"""Reading a writer's recent samples into a summary: wandb keeps them per run
(``x_stats_buffer_size``), so no second sampler runs on the node; the integer GPU series and the
GPUs' models and UUIDs come from the writer's own transaction log (see ``summary``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .._gpu_ids import nvml_inventory, visible_gpu_ids
from .._wandb.txlog import LogTail, split_label
from .kinds import Degradation
from .messages import GpuIntBatch, GpuInventory, NodeSummary, ReadProblem
from .summary import gpu_ints, summarize

# The integer GPU series of a log block wait on the node until two pings have carried them (the
# driver side keeps the newest it has, so a repeat is dropped there and one lost reply loses
# nothing), however long pings take to come round: at 1,000 nodes a logger is pinged about every
# 47 s, and blocks complete faster than that. Bounded: past PENDING_BATCHES the oldest go, counted.
PENDING_BATCHES, CARRIED_BY = 256, 2
# A finished writer's log: how long its last block may take to be written out (wandb's finish()
# returns first; seen within milliseconds), and how often to look.
FINAL_WAIT_S, FINAL_POLL_S = 2.0, 0.02


class SummaryReader:
    """The latest summary of the samples a writer took since the previous read, and what kept
    it from reading them (``problems``: at most one a source, said by the driver side once).

    One thread reads (:meth:`read`, :meth:`final`) while another takes (:meth:`take`, a node
    logger's status): its state changes under a lock of its own, never held across a call to
    wandb or a read of the log."""

    def __init__(self, tail: Callable[[str], Any] = LogTail) -> None:
        self._lock = threading.Lock()
        self.summary: NodeSummary | None = None
        self._since: float | None = None
        self._seen = 0  # samples summarised so far: ``seq`` lets a reader count what it missed
        self._open_tail = tail
        self._tail: Any = None
        # The integer GPU series of the log blocks not yet carried by CARRIED_BY pings, a batch
        # each, oldest first: [pings that carried it, the batch].
        self._ints: list[list[Any]] = []
        self.dropped = 0  # batches that waited past PENDING_BATCHES (no ping came for that long)
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
        with self._lock:
            if fresh is not None:
                self._seen += fresh.n
                self.summary, self._since = replace(fresh, seq=self._seen), fresh.t
            if self.summary is not None and (fresh is not None or logged):
                self.summary = replace(self.summary, gpu_ints=self._pending(), gpu_info=self._info)
            return self.summary

    def take(self) -> NodeSummary | None:
        """The latest summary, for a ping: it carries every integer batch that fewer than
        CARRIED_BY pings have carried (each then counts this one)."""
        with self._lock:
            if self.summary is None:
                return None  # the batches wait for the first samples
            taken = replace(self.summary, gpu_ints=self._pending())
            for entry in self._ints:
                entry[0] += 1
            self._ints = [entry for entry in self._ints if entry[0] < CARRIED_BY]
            return taken

    def read_problems(self) -> tuple[ReadProblem, ...]:
        """What kept it from reading, now (from any thread)."""
        with self._lock:
            return tuple(self.problems.values())

    def final(self, run: Any, wait_s: float = FINAL_WAIT_S) -> NodeSummary | None:
        """After ``run`` finished: the rest of its transaction log, the last, partial block
        included (waiting at most ``wait_s`` for wandb-core to write it out: its ``finish()`` can
        return first); the last summary, carrying every integer batch that fewer than CARRIED_BY
        pings carried (the driver side drops a repeat). The float samples are read before the
        finish (:meth:`read`): a finished writer keeps none."""
        deadline = time.monotonic() + wait_s
        self._read_log(run, to_end=True)
        while self._tail is not None and not self._tail.ended and self._tail.error is None:
            if time.monotonic() >= deadline:
                break
            time.sleep(FINAL_POLL_S)
            self._read_log(run, to_end=True)
        with self._lock:
            if self.summary is None:
                return None
            return replace(self.summary, gpu_ints=self._pending(), gpu_info=self._info)

    def _pending(self) -> tuple[GpuIntBatch, ...]:
        return tuple(batch for _, batch in self._ints)

    def _read_log(self, run: Any, to_end: bool = False) -> bool:
        """Take the integer GPU series from the log's new blocks (``to_end``: the finished log's
        last, partial block too; and, the first time, the GPUs' models and UUIDs); whether there
        was anything new."""
        new = False
        if self._tail is None:
            path = getattr(getattr(run, "settings", None), "sync_file", None)
            if not path:
                return False
            self._tail = self._open_tail(str(path))
            info = nvml_inventory()
            if info is not None:
                models, uuids = tuple(info.get("models") or ()), tuple(info.get("uuids") or ())
                self._info = GpuInventory(models, uuids, visible_gpu_ids())
            new = self._info is not None
        stats = []
        for record in self._tail.read(to_end):
            if record.WhichOneof("record_type") == "stats":
                t = record.stats.timestamp.seconds + record.stats.timestamp.nanos / 1e9
                items = {
                    split_label(i.key or "/".join(i.nested_key))[0]: _json(i.value_json) for i in record.stats.item
                }
                stats.append((t, items))
        error = self._tail.error
        ints = gpu_ints(stats)
        with self._lock:
            if error is not None:  # the tail stops there: said once, by the driver side
                self.problems[Degradation.LOG_UNREADABLE] = ReadProblem(
                    Degradation.LOG_UNREADABLE, error.reason, str(error)
                )
            if ints is not None:
                self._ints.append([0, ints])
                if len(self._ints) > PENDING_BATCHES:
                    self.dropped += len(self._ints) - PENDING_BATCHES
                    del self._ints[:-PENDING_BATCHES]
                new = True
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
