"""One writer's offline run uploaded into its W&B run, as shared mode would have written it:
``wandb beta sync --id`` in a process of its own, told its writer's role.

Syncing several offline runs of one id with plain ``wandb sync`` does not merge them: each starts
its files at offset 0 and overwrites the one before (wandb issue #3841). wandb's own sync honours
shared mode when asked (``WANDB_MODE=shared``): each file is then a writer of its own, as it was
online; a node writer's is a non-primary writer that never sets the run's state
(``WANDB_X_PRIMARY=false``, ``WANDB_X_UPDATE_FINISH_STATE=false``), its keys under the label it
wrote them with. Used by the command line's ``ray-wandb-nodes sync`` and by the fleet at the end
of a run whose nodes without a route to W&B wrote offline.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._config.secrets import Secret
from .txlog import TransactionLogError, cut_to_whole_records
from .writers import Role

_TAIL_LINES = 5


@functools.cache
def _skips_online() -> bool:
    """Whether this wandb's ``beta sync`` skips a run folder written online unless told not to
    (``--no-skip-online``: wandb 0.31; 0.28 has no such option and syncs every folder given)."""
    try:
        from wandb.cli.beta import sync

        return any(getattr(p, "name", "") == "skip_online" for p in sync.params)
    except Exception:  # noqa: BLE001 - an older or changed CLI: no option to give
        return False


def sync_command(path: str, run_id: str, project: str | None, entity: str | None) -> list[str]:
    """The command that uploads the offline run folder ``path`` into the run ``run_id`` (a folder
    written online too: a relayed writer whose relay died, collected from its node)."""
    cmd = [sys.executable, "-m", "wandb", "beta", "sync", "--id", run_id]
    if _skips_online():
        cmd.append("--no-skip-online")
    if project:
        cmd += ["--project", project]
    if entity:
        cmd += ["--entity", entity]
    return [*cmd, path]


def sync_environment(role: Role, environ: Mapping[str, str], label: str | None = None) -> dict[str, str]:
    """``environ`` with the mode a writer of ``role`` is synced in: shared, primary or not, for a
    shared run's writers, with the writer's ``label`` (its console lines' label is the syncing
    process's setting, not in the records); a run of its own for the rest."""
    env = dict(environ)
    if role.joins_shared_run:
        primary = "true" if role is Role.PRIMARY else "false"
        env.update(WANDB_MODE="shared", WANDB_X_PRIMARY=primary, WANDB_X_UPDATE_FINISH_STATE=primary)
        if label:
            env["WANDB_X_LABEL"] = label
    else:
        env.pop("WANDB_MODE", None)
    return env


def offline_runs(folder: str) -> list[str]:
    """The offline run folders (``offline-run-...``, each holding one ``.wandb`` file) under
    ``folder``, not following links (wandb's ``latest-run`` is one)."""
    found = []
    for root, _, names in os.walk(folder):
        found += [root for name in names if name.endswith(".wandb")]
    return sorted(set(found))


@dataclass(frozen=True)
class SyncInto:
    """The W&B run a node's offline run goes into, and the credentials to send it with (the
    run's own: its host and key, never shown)."""

    run_id: str
    role: Role  # of the writer whose run it is: NODE (a shared run's) or RUN (a run of its own)
    project: str | None
    entity: str | None
    base_url: str | None
    api_key: Secret | None

    def environment(self, environ: Mapping[str, str], label: str | None = None) -> dict[str, str]:
        """The sync's process environment: ``environ`` less W&B's own variables, with the run's
        host and key, in the writer's role."""
        env = {k: v for k, v in environ.items() if not k.startswith("WANDB_")}
        env.update(WANDB_SILENT="true", WANDB_ERROR_REPORTING="false")
        if self.base_url:
            env["WANDB_BASE_URL"] = self.base_url
        if self.api_key is not None:
            env["WANDB_API_KEY"] = self.api_key.reveal()
        return sync_environment(self.role, env, label)


def sync_folder(
    into: SyncInto,
    folder: str,
    deadline: float,
    *,
    environ: Mapping[str, str] | None = None,
    label: str | None = None,
    runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    on_cut: Callable[[str, int], None] | None = None,
) -> str | None:
    """Upload every offline run under ``folder`` into ``into``'s run, one after another, before
    ``deadline`` (monotonic), as the writer ``label``'s; None when all went up (wandb's
    ``.synced`` mark beside each file), else what failed, in a line.

    A transaction log that ends inside a record (its writer's process ended before it wrote its
    last block out: a relayed writer whose relay died, a node lost) is cut after its last whole
    record first, as wandb's sync refuses the file otherwise; ``on_cut(path, bytes)`` is told."""
    runs = offline_runs(folder)
    if not runs:
        return f"no offline run in {folder}"
    env = into.environment(os.environ if environ is None else environ, label)
    for path in runs:
        if _synced(path):
            continue
        for log in (os.path.join(path, n) for n in os.listdir(path) if n.endswith(".wandb")):
            try:
                cut = cut_to_whole_records(log)
            except (OSError, TransactionLogError):
                continue  # damaged before its end, or unreadable: wandb's sync says what it can
            if cut and on_cut is not None:
                on_cut(log, cut)
        left = deadline - time.monotonic()
        if left <= 0:
            return "no time was left to sync it"
        command = sync_command(path, into.run_id, into.project, into.entity)
        try:
            done = runner(command, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            return f"wandb sync did not finish within {left:.0f}s"
        except OSError as e:
            return f"wandb sync could not start ({e.strerror or e})"
        if done.returncode != 0 or not _synced(path):
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-_TAIL_LINES:])
            return f"wandb sync exited {done.returncode}: {tail}" if tail else f"wandb sync exited {done.returncode}"
    return None


def _synced(path: str) -> bool:
    return any(name.endswith(".wandb.synced") for name in os.listdir(path))
