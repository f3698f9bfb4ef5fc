"""A failed attempt as the run's primary writes it (``_failure.FailureNotice``): the alert, the run
summary's ``failure`` fields (a runs table's column of why runs failed) and the tracebacks and each
failing rank's account as files of the run (``failures/attempt-<n>/``); offline, the files stay in
the run's folder and sync with it, and the folder's index keeps every attempt's summary for the
report. Each failure is one warning; training goes on."""

from __future__ import annotations

from typing import Any, Protocol

from .._failure import FailureNotice
from .._health import Alert, EventKind
from .._warn import Warner, describe
from ..offline.index import OfflineIndex
from .run_files import save_run_files


def failure_alert(notice: FailureNotice, label: str) -> Alert:
    """The W&B alert of ``notice`` (an ERROR for a failed attempt, an INFO for a recovery), on the
    first cause's node where there is one, else ``label`` (the primary's)."""
    node = notice.summary.node or label
    return Alert(notice.title, notice.text, notice.level, node, EventKind.RANK_FAILED, recovered=notice.level == "INFO")


class FailureIndex(Protocol):
    """Offline: the run folder's index (``PrimaryIndex``), which keeps every attempt's failure."""

    def failure(self, notice: FailureNotice) -> None: ...


def save_failure(run: Any, notice: FailureNotice, warner: Warner, index: FailureIndex | None = None) -> None:
    """``notice``'s summary fields and files, into the run; offline (``index``), into its index too."""
    offline = index is not None
    if index is not None:
        index.failure(notice)
    try:
        run.summary.update(notice.summary.as_summary())
    except Exception as e:  # noqa: BLE001
        warner.warn(f"failure-summary:{type(e).__name__}", f"the run's failure summary was not set ({describe(e)})")
    if not notice.files:
        return
    try:
        save_run_files(run, notice.folder, notice.files, offline)
    except Exception as e:  # noqa: BLE001
        warner.warn(f"failure-files:{type(e).__name__}", f"a failure's files could not be saved ({describe(e)})")


def index_failure(index: OfflineIndex, notice: FailureNotice) -> None:
    """Offline: every attempt's failure summary in the run folder's index, for the report
    (``OSError`` when it cannot be written)."""
    failures = [f for f in index.data.get("failures") or [] if isinstance(f, dict)]
    entry = notice.summary.as_summary()["failure"]
    if notice.summary.recovered:  # the recovery of an attempt already listed
        failures = [{**f, "recovered": True} if f.get("attempt") == notice.summary.attempt else f for f in failures]
    else:
        failures.append(entry)
    index.update(failures=failures)
