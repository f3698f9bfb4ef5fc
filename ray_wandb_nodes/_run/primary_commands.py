"""What the hooks, the fleet thread and the artifact thread hand a run's primary writer, defined
once: one NamedTuple a command (its queue carries them in order; nothing blocks). The writer
thread answers each in ``PrimaryWriter._handle``, by its type, as the fleet thread answers the
fleet's (``_fleet/commands.py``). A new thing to write is a new command type and a method of
``PrimaryWriter`` that puts it on the queue."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._console import ConsoleLine
    from .._failure import FailureNotice
    from .._hang import HangNotice
    from .._health import Alert
    from .._wandb.uploads import Upload


class LogReport(NamedTuple):
    """One report (a dict, or all ranks' dicts) to log as one row at the step metric. The row
    builder reads it on the writer thread and never changes it; the sender must not either."""

    metrics: Any


class UpdateConfig(NamedTuple):
    """Run config learnt after the start (a copy: the sender may change its own)."""

    config: dict[str, Any]


class LogArtifact(NamedTuple):
    """A checkpoint artifact the artifact thread built (``_wandb/uploads.py``), to log with its
    upload's record; a run that does not exist settles it unlogged."""

    artifact: Any
    upload: Upload


class RaiseAlert(NamedTuple):
    """An alert of the run (offline: kept in the run's folder index)."""

    alert: Alert


class RecordHang(NamedTuple):
    """A hang or its end: its alert, the ``hangs`` table and every rank's evidence as files."""

    notice: HangNotice


class WriteConsole(NamedTuple):
    """Ranks' console lines (the ranks on the primary's own node) for the run's Logs tab."""

    lines: Sequence[ConsoleLine]


class RecordFailure(NamedTuple):
    """A failed attempt or a recovery: its alert, the summary's ``failure`` fields and the
    tracebacks and ranks' accounts as files (offline: also in the run's folder index)."""

    notice: FailureNotice


class LogHealth(NamedTuple):
    """The straggler count (None: not logged) and, when given, the ``nodes`` and ``gpus`` tables,
    at the current step."""

    stragglers: int | None
    table: list[list[Any]] | None
    gpu_table: list[list[Any]] | None = None


class LogRanks(NamedTuple):
    """The slow-rank history keys (None: none due) and, when given, the ``ranks`` table, at the
    current step."""

    history: dict[str, float] | None
    table: list[list[Any]] | None


class Finish(NamedTuple):
    """Log the artifacts still being built (not after an abort), then finish the run with
    ``exit_code``; the writer thread ends."""

    exit_code: int


# What goes into the run as it is (``RunWrites.apply``); the writer answers the others itself.
RunCommand = LogReport | UpdateConfig | RaiseAlert | RecordHang | RecordFailure | WriteConsole | LogHealth | LogRanks
PrimaryCommand = (
    LogReport
    | UpdateConfig
    | LogArtifact
    | RaiseAlert
    | RecordHang
    | RecordFailure
    | WriteConsole
    | LogHealth
    | LogRanks
    | Finish
)
