"""What the fleet needs of a shared run's primary writer, as a protocol the fleet owns: the
writer's spec and where it writes, its own node's samples, and the writes the fleet hands it
(alerts, hangs, failures, health and rank tables, config it learns, the console of the ranks on its
own node). The driver side's primary (``_run.primary.PrimaryWriter``) implements it; the fleet never
imports the run it serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._console import ConsoleLine
    from .._failure import FailureNotice
    from .._hang import HangNotice
    from .._health import Alert, NodeSummary, ReadProblem
    from .._wandb.writers import WriterSpec
    from ..offline.index import OfflineIndex


class RunWriter(Protocol):
    """A shared run's primary writer, as the fleet thread sees it. Each write is handed over (the
    writer's own thread does it): none waits on W&B."""

    spec: WriterSpec
    entity: str | None
    project: str | None
    index: OfflineIndex | None

    def alert(self, alert: Alert) -> None:
        """Raise ``alert`` in the run."""

    def update_config(self, config: Mapping[str, Any]) -> None:
        """Merge ``config`` into the run's config (its top-level keys replaced)."""

    def hang(self, notice: HangNotice) -> None:
        """A hang (or its end): its alert, the ``hangs`` table and every rank's evidence."""

    def console_lines(self, lines: Sequence[ConsoleLine]) -> None:
        """Write ranks' console lines into the run's Logs tab (the ranks on the writer's own node)."""

    def failure(self, notice: FailureNotice) -> None:
        """A failed attempt (or a recovery): its alert, the summary's ``failure`` fields and the
        tracebacks as files of the run."""

    def log_health(
        self, stragglers: int | None, table: list[list[Any]] | None, gpu_table: list[list[Any]] | None = None
    ) -> None:
        """The straggler count and the ``nodes`` and ``gpus`` tables, at the current step."""

    def log_ranks(self, history: dict[str, float] | None, table: list[list[Any]] | None) -> None:
        """The slow-rank history keys and the ``ranks`` table (each when given), at the current step."""

    @property
    def summary(self) -> NodeSummary | None:
        """The latest summary of the writer's own node's samples."""

    @property
    def read_problems(self) -> tuple[ReadProblem, ...]:
        """What kept the writer's reader from its samples."""
