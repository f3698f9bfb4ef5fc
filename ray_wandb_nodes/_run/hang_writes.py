"""A hang as the run's primary writes it: the alert, the ``hangs`` table at the current step, and
every rank's evidence as files of the run (``hangs/hang-<n>/``); offline, the files stay in the
run's folder and sync with it. Each failure is one warning; training goes on."""

from __future__ import annotations

from typing import Any

from .._hang import HANG_COLUMNS, HangNotice
from .._health import Alert, EventKind
from .._wandb.runs import health_table
from .._warn import Warner, describe
from .run_files import save_run_files


def hang_alert(notice: HangNotice, label: str) -> Alert:
    """The W&B alert of ``notice`` (an ERROR for a hang, an INFO when progress resumed)."""
    return Alert(notice.title, notice.text, notice.level, label, EventKind.HANG, recovered=notice.level == "INFO")


def save_hang(run: Any, notice: HangNotice, row: dict[str, Any], warner: Warner, offline: bool = False) -> None:
    """Log ``notice``'s table in ``row`` (at the current step) and save its files into the run."""
    if not notice.rows and not notice.files:
        return
    try:
        save_run_files(run, notice.folder, notice.files, offline)
    except Exception as e:  # noqa: BLE001
        warner.warn(f"hang-files:{type(e).__name__}", f"a hang's stack files could not be saved ({describe(e)})")
    try:
        if notice.rows:
            run.log({**row, "hangs": health_table(list(HANG_COLUMNS), notice.table())})
    except Exception as e:  # noqa: BLE001
        warner.warn(f"hangs-table:{type(e).__name__}", f"the hangs table could not be logged ({describe(e)})")
