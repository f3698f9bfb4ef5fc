"""A node logger's part of slow ranks: its ranks' step totals read off their slots every
:data:`READ_S` (a ``pread`` of each watched rank's slot, a few microseconds a rank), kept as
points by step count (``_steps.NodePoints``) and handed to each status ping, spread over the steps
since the last. A ping may come a minute after the last on a large fleet (``pool.PING_BATCH``):
the points it carries still say each rank's totals at the steps they cover, which is what the
driver side compares (``_steps.StepMarks``), however old the read."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from .._hang import NodeWatch, RankProgress
from .._steps import NodePoints, RankSteps, decode

READ_S = 1.0  # a rank publishes every 32 steps or every step of 50 ms or more (``_steps.recorder``)


class NodeSteps:
    """The points of the ranks a node watches. Its reader thread starts with the first watch."""

    def __init__(self, watch: NodeWatch, read_s: float = READ_S) -> None:
        self._watch = watch
        self._read_s = read_s
        self._lock = threading.Lock()
        self._points = NodePoints()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read every ``read_s`` from now on (idempotent)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ray_wandb_nodes-steps", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._read_s):
            self.read()

    def read(self) -> None:
        """One read of every watched rank's region; a region never written, or caught mid-write,
        is read next time."""
        try:
            regions = self._watch.regions()
        except OSError:
            return  # a folder removed under the read (an attempt's end): the next read
        with self._lock:
            for key, slots in regions.items():
                for rank, pid, raw in slots:
                    if raw and (totals := decode(raw)) is not None:
                        self._points.add(key, rank, pid, totals)

    def take(self, read: Mapping[str, tuple[tuple[RankProgress, bytes], ...]]) -> dict[str, tuple[RankSteps, ...]]:
        """What a status ping carries: the points since the last ping of each watched attempt
        (``read``: the ping's own read of the ranks, which is the latest point of each)."""
        with self._lock:
            for key, ranks in read.items():
                for progress, raw in ranks:
                    if raw and (totals := decode(raw)) is not None:
                        self._points.add(key, progress.rank, progress.pid, totals)
            return self._points.take(keys=set(read))
