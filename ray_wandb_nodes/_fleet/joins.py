"""The node writers' joins the pool started (``pool.py``): each answered in its turn, or given up
with one warning past wandb's init timeout and ``JOIN_GRACE_S``; which joins of a run or of a
logger have not answered; and every join that has."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._warn import Warner
from .actors import RayActors
from .handle import LoggerHandle
from .plan import run_of

JOIN_GRACE_S = 60.0  # scheduling and process start, on top of wandb's init timeout


@dataclass
class Join:
    """One writer's join in flight: its logger, its writer key, its call and when it started."""

    handle: LoggerHandle
    run_id: str
    ref: Any
    started: float


class Joins:
    """The joins in flight, on the fleet thread. ``clock``: the pool's."""

    def __init__(self, *, init_timeout_s: float, warner: Warner, actors: RayActors, clock: Callable[[], float]) -> None:
        self._init_timeout_s = init_timeout_s
        self._warner = warner
        self._actors = actors
        self._clock = clock
        self._pending: list[Join] = []
        # (node, writer key) of every join that has answered (joined, failed or timed out)
        self.joined: set[tuple[str, str]] = set()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, handle: LoggerHandle, run_id: str, ref: Any) -> None:
        """A join of writer ``run_id`` started in ``handle``'s logger (its call: ``ref``)."""
        self._pending.append(Join(handle=handle, run_id=run_id, ref=ref, started=self._clock()))

    def joining(self, run_id: str) -> bool:
        """Whether a join of a writer of ``run_id`` (a run id or an observer key) has not answered."""
        return any(run_of(j.run_id)[0] == run_of(run_id)[0] for j in self._pending)

    def of(self, handle: LoggerHandle) -> set[str]:
        """``handle``'s writers whose join has not answered yet."""
        return {j.run_id for j in self._pending if j.handle is handle}

    def check(self, answered: Callable[[LoggerHandle, Any, str], object]) -> None:
        """Each join that answered handed to ``answered`` (its logger, its call, its writer key);
        one that has not answered past wandb's init timeout and ``JOIN_GRACE_S`` given up, with
        one warning."""
        if not self._pending:
            return
        ready_set = self._actors.answered([j.ref for j in self._pending])
        now = self._clock()
        still: list[Join] = []
        for join in self._pending:
            if join.ref in ready_set:
                self.joined.add((join.handle.node.node_id, join.run_id))
                answered(join.handle, join.ref, join.run_id)
            elif now - join.started > self._init_timeout_s + JOIN_GRACE_S:
                self._warner.warn(
                    f"join-timeout:{join.handle.node.node_id}:{join.run_id}",
                    f"the node writer on {join.handle.node.label} has not joined the W&B run {join.run_id} after "
                    f"{now - join.started:.0f}s; that node's system metrics may be missing",
                )
                self.joined.add((join.handle.node.node_id, join.run_id))
            else:
                still.append(join)
        self._pending = still
