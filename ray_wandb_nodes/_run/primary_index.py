"""Offline: the primary's part of the run folder's index (``offline/index.py``): the run and the
primary's own offline run once it exists, every alert (wandb keeps none offline; the report
prints them), the latest ``ranks`` table, every failed attempt's summary (for the report), and
the exit code. Written on the primary's writer thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from .._failure import FailureNotice
from .._health import RANK_COLUMNS, Alert
from .._wandb.writers import Role, WriterSpec
from .._warn import Warner, describe
from ..offline.index import OfflineIndex
from .failure_writes import index_failure


class PrimaryIndex:
    """Offline: the primary's part of the run folder's index. The run and the primary's own
    offline run once it exists, every alert (wandb keeps none offline; the report prints them),
    the latest ``ranks`` table and the exit code. A write that fails is one warning; training goes on."""

    def __init__(self, index: OfflineIndex, warner: Warner) -> None:
        self.index = index
        self._warner = warner

    def started(self, spec: WriterSpec, entity: str | None, project: str | None) -> None:
        self._write(lambda: index_primary(self.index, spec, entity, project))

    def alert(self, alert: Alert) -> None:
        def add() -> None:
            raised = list(self.index.data.get("alerts") or [])
            self.index.update(alerts=[*raised, {"time": time.time(), **asdict(alert)}])

        self._write(add)

    def failure(self, notice: FailureNotice) -> None:
        self._write(lambda: index_failure(self.index, notice))

    def ranks(self, rows: list[list[Any]]) -> None:
        """The latest ``ranks`` table (the run's own holds every one logged; the report prints this)."""
        self._write(lambda: self.index.update(ranks={"time": time.time(), "columns": RANK_COLUMNS, "rows": rows}))

    def finished(self, exit_code: int) -> None:
        self._write(lambda: self.index.update(exit_code=exit_code))

    def _write(self, write: Callable[[], None]) -> None:
        try:
            write()
        except OSError as e:
            self._warner.warn("offline-index", f"the offline index could not be written ({describe(e)})")


def index_primary(index: OfflineIndex, spec: WriterSpec, entity: str | None, project: str | None) -> None:
    """Offline: name the run and the primary's own offline run in the run's folder index
    (``OSError`` when it cannot be written)."""
    import socket

    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        node_id = None
    index.update(entity=entity or None, project=project or index.data["project"])
    index.set_writer(
        {
            "role": Role.PRIMARY.value,
            "label": spec.label,
            "node_id": node_id,
            "hostname": socket.gethostname(),
            "state": "written",
            # its folder, as a node's is nodes/<label>: every fit of the run writes there
            "path": index.relative(spec.init_kwargs["dir"]),
        }
    )
