"""Upload an offline run folder into one W&B run, the way shared mode would have written it.

This runs ``wandb beta sync --id`` (what ``wandb sync`` runs from wandb 0.29; on 0.28 ``wandb
sync`` is the older uploader, which ignores shared mode) once per writer, in its writer's role
(``_wandb.sync``: why shared mode), the primary first (``x_primary``, it owns the run's final
state), then every node writer as a non-primary writer that never sets the run's state.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._wandb.sync import sync_command, sync_environment
from .._wandb.txlog import TransactionLogError, cut_to_whole_records, read_run
from .._wandb.writers import Role
from .walk import absent_writers, find_run_folders, identify, wandb_files


@dataclass
class SyncStep:
    run_id: str
    label: str
    role: Role  # PRIMARY, NODE or RUN
    file: str  # the run-<id>.wandb transaction log
    project: str | None
    entity: str | None
    synced: bool  # already synced (wandb's .synced marker)
    error: str | None = None  # the file is damaged; wandb sync may stop there

    @property
    def path(self) -> str:
        """The offline-run-... folder that wandb sync takes."""
        return os.path.dirname(self.file)

    @property
    def marker(self) -> str:
        """wandb sync's mark of a file it uploaded."""
        return self.file + ".synced"

    @property
    def shared(self) -> bool:
        return self.role.joins_shared_run

    def command(self, entity: str | None, project: str | None) -> list[str]:
        return sync_command(self.path, self.run_id, project or self.project, entity or self.entity)

    def env(self) -> dict[str, str]:
        # The console lines' label is the syncing process's setting, not in the records: the writer's.
        return sync_environment(self.role, os.environ, label=self.label)


def plan(folder: str) -> tuple[list[SyncStep], list[dict[str, Any]]]:
    """The writers to upload, run by run (each run's primary first, then its node writers),
    and the writers the runs' indexes name that have no file here (nothing to upload)."""
    steps: list[SyncStep] = []
    absent: list[dict[str, Any]] = []
    for run_folder, index in find_run_folders(folder):
        found = []
        for path in wandb_files(run_folder):
            log = read_run(path, strict=False)
            who = identify(log, run_folder, index)
            step = SyncStep(
                run_id=who.run_id,
                label=who.labels[0] or "(unlabelled)",
                role=who.role,
                file=path,
                project=log.project or (index or {}).get("project"),
                entity=log.entity or (index or {}).get("entity"),
                synced=os.path.exists(path + ".synced"),
                error=str(log.error) if log.error else None,
            )
            found.append((log.start_time or 0.0, step))
        found.sort(key=lambda x: (x[1].run_id, x[1].role is not Role.PRIMARY, x[1].label, x[0]))
        steps.extend(step for _, step in found)
        absent.extend(absent_writers(index, {step.label for _, step in found}))
    return steps, absent


def logged_in() -> tuple[bool, str]:
    """Whether this machine has a W&B key for the base URL (env, or netrc from `wandb login`)."""
    from .._config.secrets import capture_env
    from .._config.setup import default_base_url

    default = default_base_url()
    env = capture_env(os.environ, default_base_url=default)
    return env.api_key is not None, env.base_url or default or "W&B"


def sync(
    steps: list[SyncStep],
    *,
    entity: str | None = None,
    project: str | None = None,
    dry_run: bool = False,
    out: Callable[[str], None] = print,
    runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int:
    """Upload ``steps`` in order; 0 when all went (or would go) up, 1 otherwise."""
    failed_runs: set[str] = set()
    failures = 0
    for step in steps:
        what = f"{step.run_id}  {step.role.value:<7} {step.label}  {step.path}"
        if step.synced:
            out(f"skip  {what}  (already synced)")
            continue
        if step.run_id in failed_runs:
            out(f"skip  {what}  (its primary did not sync)")
            failures += 1
            continue
        if step.error and not dry_run and _cut_unfinished(step, out):
            step.error = None
        if step.error:
            out(f"note  {step.label}: {step.error}; wandb sync uploads what precedes the damage")
        if dry_run:
            mode = f"shared, x_primary={step.role is Role.PRIMARY}" if step.shared else "a run of its own"
            out(f"would sync  {what}  ({mode})")
            continue
        out(f"sync  {what}")
        proc = runner(step.command(entity, project), env=step.env(), capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(step.marker):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
            out(f"FAILED  {step.label}: wandb sync exited {proc.returncode}: " + " | ".join(tail))
            failures += 1
            if step.role is Role.PRIMARY:
                failed_runs.add(step.run_id)
    return 1 if failures else 0


def _cut_unfinished(step: SyncStep, out: Callable[[str], None]) -> bool:
    """``step``'s log cut after its last whole record where it ends inside one (wandb's sync
    refuses such a file): True where it was cut."""
    try:
        cut = cut_to_whole_records(step.file)
    except (OSError, TransactionLogError):
        return False  # damaged before its end: wandb's sync uploads what precedes the damage
    if cut:
        out(
            f"note  {step.label}: its log ended inside a record (its writer's process ended before writing it "
            f"out): the last {cut} bytes cut, every whole record before them is synced"
        )
    return cut > 0
