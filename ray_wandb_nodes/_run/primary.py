"""The run's primary writer: one background thread that owns the ``wandb`` run.

Hooks only put work on a queue (a typed command each, ``primary_commands``: no I/O), so the
Train controller's event loop and Tune's loop never wait on W&B. The thread creates the run,
logs rank 0's reports (or a trial's results) against the step metric, logs the artifacts that
:class:`~ray_wandb_nodes._wandb.uploads.ArtifactUploads` builds, and finishes the run with the
training's exit code. Offline, :class:`~.primary_index.PrimaryIndex` keeps the primary's part
of the run folder's index.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._config.values import RankMetrics
from .._console import ConsoleLine
from .._failure import FailureNotice
from .._hang import HangNotice
from .._health import (
    Alert,
    NodeSummary,
    ReadProblem,
    SummaryReader,
    aged,
)
from .._wandb.metrics import RowBuilder
from .._wandb.runs import init_writer
from .._wandb.strategies import report_rows
from .._wandb.uploads import ArtifactUploads
from .._wandb.writers import WriterSpec, offline_index
from .._warn import Warner, describe
from ..offline.index import OfflineIndex
from .primary_commands import (
    Finish,
    LogArtifact,
    LogHealth,
    LogRanks,
    LogReport,
    PrimaryCommand,
    RaiseAlert,
    RecordFailure,
    RecordHang,
    UpdateConfig,
    WriteConsole,
)
from .primary_index import PrimaryIndex
from .run_writes import RunWrites

_WATCH_END_S = 5.0  # after the finish: wandb has answered every upload, reading the answers is quick


class PrimaryWriter:
    """A run's primary: the writer thread and its queue, which the hooks fill and never wait on."""

    def __init__(
        self,
        spec: WriterSpec,
        *,
        warner: Warner,
        rows: RowBuilder | None = None,
        prepare: Callable[[WriterSpec], WriterSpec] | None = None,
    ) -> None:
        """``prepare`` runs on the writer thread before ``wandb.init`` and may adjust the spec."""
        self.spec = spec
        self._rows = rows or report_rows(RankMetrics.RANK0, ())
        self._prepare = prepare
        self._on_ready: Callable[[], None] | None = None
        self._warner = warner
        self._queue: queue.SimpleQueue[PrimaryCommand] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=f"ray_wandb_nodes-{spec.run_id}", daemon=True)
        self._ready = threading.Event()
        self._done = threading.Event()
        self._finish_requested = False
        self.run: Any = None
        self.error: BaseException | None = None
        self.entity: str | None = None
        self.project: str | None = None
        self._writes: RunWrites | None = None  # once the run exists
        self._dropped = 0  # reports that came while there was no run
        self.exit_code: int | None = None
        self.index: OfflineIndex | None = offline_index(spec)
        self._offline = PrimaryIndex(self.index, warner) if self.index is not None else None
        self._reader = SummaryReader()  # this node's latest samples, read on the writer thread
        self._uploads = ArtifactUploads(
            lambda artifact, upload: self._queue.put(LogArtifact(artifact, upload)), self._done, warner
        )
        self._sample_s = max(0.5, float(spec.settings.get("x_stats_sampling_interval") or 15.0))

    # called from hooks: never blocks on W&B --------------------------------------------------
    def start(self, on_ready: Callable[[], None] | None = None) -> None:
        """Start the writer thread; ``on_ready()`` is called on it once the run exists."""
        self._on_ready = on_ready
        self._thread.start()

    def log(self, payload: Any) -> None:
        """Queue one report (a dict, or all ranks' dicts) for the row builder, which reads it on
        the writer thread and never changes it; the caller must not change it either."""
        self._queue.put(LogReport(payload))

    def update_config(self, config: Mapping[str, Any]) -> None:
        self._queue.put(UpdateConfig(dict(config)))

    def log_artifact(
        self, make: Callable[[Any], Any], aliases: Sequence[str] = (), name: str = "checkpoint", where: str = ""
    ) -> None:
        """``make(wandb)`` builds the artifact on the artifact thread (never the writer thread);
        the writer thread then logs it with ``aliases``. ``name`` and the checkpoint's path
        ``where`` name it in warnings."""
        self._uploads.add(make, aliases, name, where)

    def abandon_uploads(self) -> tuple[list[str], str | None]:
        """An abort: build and log no more artifacts, and finish without them. Returns the
        checkpoints not handed to wandb (dropped) and the last one that was (wandb may still be
        uploading it)."""
        return self._uploads.abandon()

    def alert(self, alert: Alert) -> None:
        """Raise ``alert`` as a W&B alert of the run (offline: kept in the run's folder index)."""
        self._queue.put(RaiseAlert(alert))

    def hang(self, notice: HangNotice) -> None:
        """A hang (or its end): its alert, the ``hangs`` table and every rank's evidence as files."""
        self._queue.put(RecordHang(notice))

    def console_lines(self, lines: Sequence[ConsoleLine]) -> None:
        """Write ranks' console lines (those on this writer's node) into the run's Logs tab."""
        self._queue.put(WriteConsole(lines))

    def failure(self, notice: FailureNotice) -> None:
        """A failed attempt (or a recovery): its alert, the summary's ``failure`` fields, its files."""
        self._queue.put(RecordFailure(notice))

    def log_health(
        self, stragglers: int | None, table: list[list[Any]] | None, gpu_table: list[list[Any]] | None = None
    ) -> None:
        """Log the straggler count and, when given, the ``nodes`` and ``gpus`` tables, at the current step."""
        self._queue.put(LogHealth(stragglers, table, gpu_table))

    def log_ranks(self, history: dict[str, float] | None, table: list[list[Any]] | None) -> None:
        """Log the slow-rank history keys and, when given, the ``ranks`` table, at the current step."""
        self._queue.put(LogRanks(history, table))

    @property
    def summary(self) -> NodeSummary | None:
        """The latest summary of this writer's own node's samples (None before the first), with
        its age (``age_s``) on this node's clock."""
        return aged(self._reader.summary)

    @property
    def read_problems(self) -> tuple[ReadProblem, ...]:
        """What kept this writer's reader from its samples (empty: nothing)."""
        return tuple(self._reader.problems.values())

    @property
    def logged(self) -> int:
        """Reports logged as rows of the run."""
        return self._writes.logged if self._writes is not None else 0

    @property
    def dropped(self) -> int:
        """Reports not logged: no run to log them to, or a row or a log that failed."""
        return self._dropped + (self._writes.dropped if self._writes is not None else 0)

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.run is not None

    @property
    def failed(self) -> bool:
        return self._ready.is_set() and self.run is None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def request_finish(self, exit_code: int) -> None:
        """Ask the thread to flush and finish the run with ``exit_code``; returns at once."""
        if self._finish_requested:
            return
        self._finish_requested = True
        self._queue.put(Finish(exit_code))
        if not self._thread.ident:
            self._done.set()  # never started: nothing to finish

    @property
    def creating(self) -> bool:
        """Whether the writer thread is still inside ``wandb.init``."""
        return bool(self._thread.ident) and not self._ready.is_set()

    def wait_done(self, timeout: float, why: str = "") -> bool:
        """Wait for the finish; False (and one warning) when not done within ``timeout``."""
        if not self._done.wait(timeout):
            self._warner.warn(
                f"primary:finish-timeout:{self.spec.run_id}",
                f"the W&B run {self.spec.run_id} did not finish within {timeout:.0f}s{': ' + why if why else ''} "
                f"({self._queue.qsize()} queued item(s) not written); training results are unaffected",
            )
        return self._done.is_set()

    # the writer thread -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._init()
            read_at = 0.0
            while True:
                try:
                    command: PrimaryCommand | None = self._queue.get(timeout=self._sample_s)
                except queue.Empty:
                    command = None  # no command within a sampling interval: only the samples are due
                if self.run is not None and time.monotonic() - read_at >= self._sample_s:
                    read_at = time.monotonic()
                    self._reader.read(self.run)
                if isinstance(command, Finish):
                    self._log_built()
                    self._finish(command.exit_code)
                    return
                if command is not None:
                    self._handle(command)
        finally:
            self._ready.set()
            self._done.set()

    def _handle(self, command: PrimaryCommand) -> None:
        """Carry out one command: an artifact through the uploads, the others by ``RunWrites.apply``
        (a :class:`Finish` here, inside ``_log_built``, is one that came after the first: nothing to do)."""
        writes = self._writes
        if writes is None:  # no run (not created, or not yet): nothing is written
            self._dropped += isinstance(command, LogReport)
            if isinstance(command, LogArtifact):
                self._uploads.settled(command.upload)
            return
        if isinstance(command, LogArtifact):  # the uploads' own: their thread waits on it
            self._uploads.log(writes.run, command.artifact, command.upload)
        elif not isinstance(command, Finish):
            writes.apply(command)

    def _init(self) -> None:
        started = time.monotonic()
        try:
            if self._prepare is not None:
                self.spec = self._prepare(self.spec)
            self.run = init_writer(self.spec)
        except Exception as e:  # noqa: BLE001
            self.error = e
            self._warner.warn(
                f"primary:init:{self.spec.run_id}",
                f"could not create the W&B run {self.spec.run_id} after {time.monotonic() - started:.0f}s, "
                f"so nothing is logged to W&B for this run; training goes on ({describe(e)})",
            )
            return
        finally:
            self._ready.set()
        self.entity, self.project = self.run.entity, self.run.project
        if self._on_ready is not None:
            self._on_ready()
        if self._offline is not None:
            self._offline.started(self.spec, self.entity, self.project)
        self._writes = RunWrites(self.run, self.spec, self._rows, self._warner, self._offline)

    def _log_built(self) -> None:
        """Before the finish: log the artifacts still being built (not after an abort)."""
        while not self._uploads.abandoned and self.run is not None and self._uploads.pending:
            try:
                command = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self._handle(command)

    def _finish(self, exit_code: int) -> None:
        self.exit_code = exit_code
        if self.run is None:
            if self._dropped:
                self._warner.warn(
                    f"primary:dropped:{self.spec.run_id}",
                    f"{self._dropped} report(s) were not logged because the W&B run "
                    f"{self.spec.run_id} could not be created",
                )
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as e:  # noqa: BLE001
            self._warner.warn(
                f"primary:finish:{self.spec.run_id}", f"finishing the W&B run {self.spec.run_id} failed ({describe(e)})"
            )
        if not self._uploads.abandoned:  # the finish waited for the uploads: say which W&B did not commit
            self._uploads.finished(_WATCH_END_S)
        if self._offline is not None:
            self._offline.finished(exit_code)
