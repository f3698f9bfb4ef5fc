"""The fleet's view of Ray's nodes: the alive ones (re-read once a poll, less often past 1,000
nodes), how each dead one ended, and the nodes to start loggers on ahead of a job's workers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._health import NodeEnd
from .commands import Prestart
from .nodes import NodeInfo, alive_nodes, candidate_nodes, ended_nodes, prestart_nodes

LISTING_NODES = 1000  # past this many nodes, the node listing slows down in proportion
END_LISTING_S = 2.0  # a run's end reads the node listing afresh, waiting this long at most


class NodeListing:
    """Ray's node listing as the fleet thread last read it (only that thread calls it).
    ``list_nodes`` and ``free_resources`` are Ray's (``bench/fleet_scale.py`` simulates them),
    ``clock`` the fleet's."""

    def __init__(
        self,
        *,
        poll_s: float,
        list_nodes: Callable[[], list[dict[str, Any]]],
        free_resources: Callable[[], dict[str, dict[str, float]]],
        clock: Callable[[], float],
    ) -> None:
        self.list_nodes = list_nodes
        self._free_resources = free_resources
        self._poll_s = poll_s
        self._clock = clock
        self._listed_at: float | None = None
        self.alive: dict[str, NodeInfo] = {}
        self.ended: dict[str, NodeEnd] = {}  # the listing's dead nodes, how each ended (node health's lost or left)

    def refresh(self, now_s: float | None = None) -> bool:
        """Re-read the alive nodes (one GCS call) once a poll, past 1,000 nodes once per poll and
        1,000 nodes (5,000: every 15 s); whether the alive set changed (a change re-plans). Between
        listings a lost node shows as its logger's failed ping, and Train's worker-group hooks tell
        the nodes a run uses. ``now_s``: read now, waiting at most that long (a run's end).

        On a change ``alive`` is a new object; else the same one stays, so that nothing
        downstream redoes its work."""
        now = self._clock()
        every = self._poll_s * max(1.0, len(self.alive) / LISTING_NODES)
        due = self._listed_at is None or now - self._listed_at >= every or now_s is not None
        if not due:
            return False
        self._listed_at = now
        records = self.list_nodes() if now_s is None else bounded(self.list_nodes, now_s)
        if records is None:  # the listing did not answer in time: the last one stands
            return False
        alive = alive_nodes(records, self.alive)
        if alive.keys() == self.alive.keys():
            return False
        self.alive, self.ended = alive, ended_nodes(records)
        return True

    def prestart_nodes(self, ask: Prestart) -> list[NodeInfo]:
        """The nodes to start loggers on ahead: where the job's workers fit now (each node's free
        resources, its totals when those cannot be read), no more nodes than the job needs."""
        if ask.workers is None or ask.workers < 1:  # unknown: every node that could host a worker
            return candidate_nodes(self.alive, use_gpu=ask.use_gpu, exclude=ask.exclude)
        free = self._free_resources() or {n: {"CPU": i.cpus, "GPU": i.gpus} for n, i in self.alive.items()}
        asks = ask.per_worker or ({"GPU": 1.0} if ask.use_gpu else {"CPU": 1.0})
        return prestart_nodes(self.alive, free, workers=ask.workers, per_worker=asks, exclude=ask.exclude)


def bounded(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()``'s answer, or None when it takes longer than ``timeout_s`` (it goes on, on a
    daemon thread, and its answer is dropped) or raises."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except Exception:  # noqa: BLE001 - no answer: the caller keeps what it had
            pass

    thread = threading.Thread(target=run, name="ray_wandb_nodes-bounded", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else None
