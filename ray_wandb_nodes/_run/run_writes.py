"""What the primary's writer thread writes into its run once the run exists (``RunWrites``):
rows from reports at the step metric, the config, alerts (offline: into the folder's index), the
ranks' console, the node and rank tables, hangs and failures; each queued command to its write
(``apply``). Each failure is one warning and a count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from .._console import ConsoleLine, RunConsole
from .._health import (
    ALERT_WAIT_S,
    COLUMNS,
    GPU_COLUMNS,
    RANK_COLUMNS,
    Alert,
)
from .._wandb.metrics import RowBuilder, Stepper
from .._wandb.runs import health_table
from .._wandb.writers import WriterSpec
from .._warn import Warner, describe, warn_skipped
from .failure_writes import failure_alert, save_failure
from .hang_writes import hang_alert, save_hang
from .primary_commands import (
    LogHealth,
    LogRanks,
    LogReport,
    RaiseAlert,
    RecordFailure,
    RecordHang,
    RunCommand,
    UpdateConfig,
    WriteConsole,
)
from .primary_index import PrimaryIndex


class RunWrites:
    """What the writer thread writes into its run once the run exists: rows from reports at the
    step metric, config, alerts (offline: into the folder's index) and the node tables. Each
    failure is one warning and a count; training goes on."""

    def __init__(
        self, run: Any, spec: WriterSpec, rows: RowBuilder, warner: Warner, offline: PrimaryIndex | None
    ) -> None:
        self.run = run
        self._label = spec.label
        self._rows = rows
        self._warner = warner
        self._offline = offline
        # A resumed run (restart, auto-resume by name) continues its step count.
        self._stepper = Stepper.resuming(spec.step_metric, run)
        self._console: RunConsole | None = None  # the ranks' console of this node, once it has lines
        self.logged = 0
        self.dropped = 0

    def apply(self, command: RunCommand) -> None:
        """Write what ``command`` says, by its type (the writer answers ``LogArtifact`` and ``Finish``
        itself: they are the uploads' and the run's end)."""
        if isinstance(command, LogReport):
            self.report(command.metrics)
        elif isinstance(command, UpdateConfig):
            self.config(command.config)
        elif isinstance(command, RaiseAlert):
            self.alert(command.alert)
        elif isinstance(command, LogHealth):
            self.health(command.stragglers, command.table, command.gpu_table)
        elif isinstance(command, WriteConsole):
            self.console(command.lines)
        elif isinstance(command, LogRanks):
            self.ranks(command.history, command.table)
        elif isinstance(command, RecordHang):
            self.alert(hang_alert(command.notice, self._label))
            save_hang(self.run, command.notice, self.step_row(), self._warner, offline=self._offline is not None)
        elif isinstance(command, RecordFailure):
            self.alert(failure_alert(command.notice, self._label))
            save_failure(self.run, command.notice, self._warner, self._offline)
        else:
            _unknown(command)

    def report(self, metrics: Any) -> None:
        """One report (a dict, or all ranks' dicts) as one row at the step metric, and its config."""
        try:
            row, config, skipped = self._rows(metrics)
        except Exception as e:  # noqa: BLE001
            self.dropped += 1
            self._warner.warn(
                f"rows:{type(e).__name__}", f"a report could not be turned into a W&B row ({describe(e)})"
            )
            return
        warn_skipped(self._warner, skipped)
        if config:
            self.config(config)
        self._stepper.stamp(row)
        try:
            self.run.log(row)
            self.logged += 1
        except Exception as e:  # noqa: BLE001
            self.dropped += 1
            self._warner.warn(f"log:{type(e).__name__}", f"a report could not be logged to W&B ({describe(e)})")

    def console(self, lines: Sequence[ConsoleLine]) -> None:
        """Ranks' console lines into the run's Logs tab (``Run.write_logs``)."""
        try:
            if self._console is None:
                self._console = RunConsole(self.run)
            self._console(lines)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"console:{type(e).__name__}", f"ranks' console lines were not written ({describe(e)})")

    def step_row(self) -> dict[str, Any]:
        """A row at the current step (the run's own step metric)."""
        return {self._stepper.key: self._stepper.value}

    def config(self, config: dict[str, Any]) -> None:
        try:
            self.run.config.update(config, allow_val_change=True)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"config:{type(e).__name__}", f"run config could not be updated ({describe(e)})")

    def alert(self, alert: Alert) -> None:
        if self._offline is not None:  # offline: wandb keeps no alert; the report prints these
            self._offline.alert(alert)
            return
        try:
            self.run.alert(title=alert.title, text=alert.text, level=alert.level, wait_duration=ALERT_WAIT_S)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"alert:{type(e).__name__}", f"a W&B alert could not be raised ({describe(e)})")

    def health(
        self, stragglers: int | None, table: list[list[Any]] | None, gpu_table: list[list[Any]] | None = None
    ) -> None:
        row = self.step_row()
        if stragglers is not None:
            row["nodes/stragglers"] = stragglers
        try:
            if table is not None:
                row["nodes"] = health_table(COLUMNS, table)
                if gpu_table:
                    row["gpus"] = health_table(GPU_COLUMNS, gpu_table)
            self.run.log(row)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"nodes-table:{type(e).__name__}", f"the node table could not be logged ({describe(e)})")

    def ranks(self, history: dict[str, float] | None, table: list[list[Any]] | None) -> None:
        row = {**self.step_row(), **(history or {})}
        try:
            if table is not None:
                row["ranks"] = health_table(RANK_COLUMNS, table)
                if self._offline is not None:  # the report reads the last one from the folder's index
                    self._offline.ranks(table)
            self.run.log(row)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(f"ranks-table:{type(e).__name__}", f"the ranks table could not be logged ({describe(e)})")


def _unknown(command: NoReturn) -> NoReturn:
    """A command no branch of ``RunWrites.apply`` answers: mypy proves there is none (a new command
    type needs its branch, here or in the writer), and a value of another type fails here, never silently."""
    raise TypeError(f"the primary writer has no answer to {command!r}")
