"""What each node logger's status says, taken in by the pool (``pool.py``): its node's samples,
its ranks' progress, steps and memory onto its handle, its warnings and its readers' problems
said once, a join's way to W&B kept until the fleet takes it, and the nodes whose summary changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._egress import Egress
from .._health import read_warning
from .._warn import Warner, describe
from .actors import RayActors
from .handle import LoggerHandle
from .nodes import NodeInfo
from .plan import run_of
from .wire import LoggerStatus, merged_steps


class StatusIntake:
    """The loggers' statuses taken in (on the fleet thread). ``clock``: the pool's (a handle's
    ``progress_at`` is on it)."""

    def __init__(self, warner: Warner, actors: RayActors, clock: Callable[[], float]) -> None:
        self._warner = warner
        self._actors = actors
        self._clock = clock
        # Nodes whose summary changed since the fleet last took them (see take_updated()).
        self._updated: set[str] = set()
        # The ways to W&B the joins found, until the fleet takes them (take_ways()).
        self._ways: list[tuple[LoggerHandle, str, Egress]] = []

    def check_status(self, handle: LoggerHandle, ref: Any, run_id: str | None = None) -> LoggerStatus | None:
        """Turn a finished status call into one warning per problem it shows; the status (None:
        the call failed)."""
        try:
            status: LoggerStatus = self._actors.result(ref)
        except Exception as e:  # noqa: BLE001 - the actor died or could not be created
            self._warner.warn(
                f"node-dead:{handle.node.node_id}",
                f"the node logger on {handle.node.label} failed, so that node's system metrics are missing "
                f"({describe(e)})",
            )
            return None
        if handle.pid is None:
            handle.pid = status.pid
        self.took(handle, status)
        if run_id is not None and run_id in status.egress:  # a join's answer: the way its checks found
            self._ways.append((handle, run_id, status.egress[run_id]))
        for rid, error in status.errors.items():
            if run_id is None or rid == run_id:
                self._warner.warn(
                    f"node-init:{handle.node.node_id}:{rid}",
                    f"the node writer on {handle.node.label} could not join the W&B run {rid}; "
                    f"that node's system metrics are missing ({error})",
                )
        return status

    def took(self, handle: LoggerHandle, status: LoggerStatus) -> None:
        """``status``'s samples, progress, steps and memory onto ``handle``; what it says, said."""
        handle.progress, handle.progress_at = status.progress, self._clock()
        handle.steps = merged_steps(handle.steps, status.steps)
        handle.ranks_memory = status.ranks_memory
        summary = status.summary
        if summary is not None and summary is not handle.summary:
            handle.summary = summary
            self._updated.add(handle.node.node_id)
            handle.summaries = {run_of(key)[0]: s for key, s in status.summaries.items()}
        self._said(handle.node, status)

    def _said(self, node: NodeInfo, status: LoggerStatus) -> None:
        """What a logger's status says: its readers' problems (rare: once per node and cause) and
        its writers' warnings (a checkpoint left out of its artifact), each once (the warner keeps
        what it said)."""
        for key, text in status.warnings.items():
            self._warner.warn(f"node-said:{key}", text)
        for problems in status.problems.values():
            for p in problems:
                self._warner.warn(f"{p.kind}:{node.node_id}:{p.cause}", read_warning(node.label, p))

    def take_ways(self) -> list[tuple[LoggerHandle, str, Egress]]:
        """The ways to W&B the joins that answered since the last call found: (logger, writer key, way)."""
        ways, self._ways = self._ways, []
        return ways

    def take_updated(self) -> set[str]:
        """The nodes whose summary changed since the last call."""
        updated, self._updated = self._updated, set()
        return updated

    def updated_now(self) -> set[str]:
        """The nodes whose summary changed since :meth:`take_updated` was last called, left there."""
        return set(self._updated)
