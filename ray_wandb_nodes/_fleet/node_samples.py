"""The node logger's reading of its writers' samples: each hosted writer's summary of this node,
read off wandb's kept samples by a thread of its own every sampling interval (the shortest its
writers asked for), once more just before a writer's finish, and its last after it, the rest of
its transaction log included. One read at a time; a failed read is the writer's read problem,
never the others' or its finish's."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .._health import Degradation, NodeSummary, ReadProblem, aged
from .._warn import describe
from .hosted import HostedRun


class NodeSamples:
    """Reads the summaries of the writers ``joined()`` names (a snapshot, taken under the logger's lock)."""

    def __init__(self, joined: Callable[[], list[HostedRun]]) -> None:
        self._joined = joined
        self._reading = threading.Lock()  # one read of a writer's samples at a time (the sampler's, a finish's)
        self._sampler: threading.Thread | None = None
        self._sample_s = 15.0

    def start(self, interval_s: float) -> None:
        """A writer joined with this sampling interval: the thread reads at the shortest one asked."""
        self._sample_s = min(self._sample_s, max(0.5, interval_s))
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="ray_wandb_nodes-summary", daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        stop = threading.Event()
        while not stop.wait(self._sample_s):
            self.read_all()

    def read_all(self) -> None:
        """Read every joined writer's kept samples into its own summary."""
        for record in self._joined():
            self.read(record)

    def read(self, record: HostedRun) -> None:
        try:
            with self._reading:
                record.reader.read(record.run)
        except Exception as e:  # noqa: BLE001 - one writer's failed read never stops the others' or its finish
            record.read_error = ReadProblem(Degradation.SAMPLES_UNREADABLE, type(e).__name__, describe(e))

    def last(self, record: HostedRun) -> NodeSummary | None:
        """A finished writer's last summary: the rest of its transaction log read (see ``NodeLogger.finish``)."""
        try:
            with self._reading:
                return aged(record.reader.final(record.run))
        except Exception as e:  # noqa: BLE001
            record.read_error = ReadProblem(Degradation.SAMPLES_UNREADABLE, type(e).__name__, describe(e))
            return None


def taken(hosted: Iterable[HostedRun], now: float | None = None) -> dict[str, NodeSummary]:
    """Each writer's latest summary (by writer key), with its age on this node's clock, and the
    integer GPU batches no ping has carried twice yet (a ping's status takes them)."""
    out = {}
    for record in hosted:
        summary = aged(record.reader.take(), now)
        if summary:
            out[record.key] = summary
    return out
