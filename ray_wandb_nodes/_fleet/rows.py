"""History rows of the standalone runs (node and all strategies), routed to the logger hosting
each run's writer; rows for a writer not placed yet wait (bounded) and go in order once it is."""

from __future__ import annotations

from typing import Any

from .._wandb.metrics import to_row
from .._warn import Warner, warn_skipped
from .commands import LogArtifact, LogRow
from .pool import LoggerHandle
from .targets import StandaloneTarget

MAX_PENDING_ROWS = 10_000


class RowRouter:
    def __init__(self, warner: Warner) -> None:
        self._warner = warner
        self._pending: dict[str, list[dict[str, Any]]] = {}

    def deliver(self, command: LogRow | LogArtifact, target: StandaloneTarget, host: LoggerHandle | None) -> None:
        """A row or a checkpoint of ``target``'s run, for ``host`` (None: its writer is not placed yet)."""
        if isinstance(command, LogRow):
            self.route(target, command.metrics, host)
        elif host is not None:
            host.actor.log_artifact.remote(*command)
        else:
            self._warner.warn(
                f"artifact:{target.run_id}", f"a checkpoint of {target.run_id} was not logged: its writer is not placed"
            )

    def route(self, target: StandaloneTarget, metrics: dict[str, Any], host: LoggerHandle | None) -> None:
        """One report of ``target``'s run, as a row, to ``host`` (None: not placed yet)."""
        run_id = target.run_id
        row, skipped = to_row(metrics, target.excludes)
        warn_skipped(self._warner, skipped)
        if host is not None:
            host.actor.log.remote(run_id, row)
            return
        pending = self._pending.setdefault(run_id, [])
        if len(pending) < MAX_PENDING_ROWS:
            pending.append(row)
        else:
            self._warner.warn(
                f"pending:{run_id}", f"the W&B run {run_id} has no writer yet; rows beyond {MAX_PENDING_ROWS} dropped"
            )

    def placed(self, run_id: str, host: LoggerHandle) -> None:
        """``run_id``'s writer is placed on ``host``: the rows that waited go there, in order."""
        for row in self._pending.pop(run_id, []):
            host.actor.log.remote(run_id, row)

    def waiting(self, run_id: str) -> bool:
        return bool(self._pending.get(run_id))

    def drop(self, run_id: str) -> None:
        self._pending.pop(run_id, None)
