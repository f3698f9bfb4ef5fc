"""What a run's commands change in its target (on the fleet thread, the targets' one owner): the
run added or ready, its nodes and ranks, its process, its node health ended or reported to, its
ranks finished or checkpointed (its hang watch), its attempt failed or recovered (its failure
watch). A command for a target that is no longer the run's changes nothing."""

from __future__ import annotations

from .commands import (
    AddRun,
    AttemptFailed,
    AttemptRecovered,
    Checkpointed,
    Command,
    EndHealth,
    Located,
    RankReport,
    RanksFinished,
    RunReady,
    SetNodes,
)
from .health import rank_report
from .targets import RunTarget, SharedTarget

TARGET_COMMANDS = (
    AddRun, RunReady, SetNodes, Located, EndHealth, RankReport, RanksFinished, Checkpointed, AttemptFailed,
    AttemptRecovered,
)  # fmt: skip


def apply_to_targets(targets: dict[str, RunTarget], command: Command) -> None:
    """``command``'s change to its run's target in ``targets`` (one of ``TARGET_COMMANDS``)."""
    if isinstance(command, AddRun):
        targets[command.target.run_id] = command.target
    elif isinstance(command, RunReady):
        if targets.get(command.target.run_id) is command.target:
            command.target.ready = True
    elif isinstance(command, SetNodes):
        _set_nodes(targets.get(command.run_id), command)
    elif isinstance(command, Located):
        target = targets.get(command.run_id)
        if isinstance(target, SharedTarget) and (command.only is None or command.only is target):
            target.process = command.process
    elif isinstance(command, EndHealth):
        target = targets.get(command.run_id)
        if isinstance(target, SharedTarget):
            target.health = None
            target.wants_report.clear()
    elif isinstance(command, RankReport):
        rank_report(targets.get(command.run_id), command.metrics, command.at, command.checkpoint)
    elif isinstance(command, (RanksFinished, Checkpointed)):
        target = targets.get(command.run_id)
        if isinstance(target, SharedTarget) and target.hangs is not None:
            if isinstance(command, RanksFinished):
                target.hangs.finished = command.ranks
            else:
                target.hangs.checkpoint_reports = command.reports
    elif isinstance(command, (AttemptFailed, AttemptRecovered)):
        target = targets.get(command.run_id)
        if isinstance(target, SharedTarget) and target.failures is not None:
            if isinstance(command, AttemptFailed):
                target.failures.failed(command.failed)
            else:
                target.failures.recovered(command.attempt)


def _set_nodes(target: RunTarget | None, command: SetNodes) -> None:
    if target is None or (command.only is not None and command.only is not target):
        return
    target.nodes, target.covered_node = command.nodes, command.covered
    if command.ranks is not None:
        target.ranks = command.ranks
    if command.rank_gpus is not None:
        target.rank_gpus = command.rank_gpus
    if command.attempt is not None:
        target.attempt = command.attempt
    if command.pids is not None:
        target.pids = command.pids
