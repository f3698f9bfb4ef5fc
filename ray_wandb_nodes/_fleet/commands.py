"""What the hooks hand the fleet thread, defined once: one NamedTuple a command (the queue
carries them in order; nothing blocks). The thread answers each in ``FleetWorker.apply``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .._failure import FailedAttempt
    from .._gpu_ids import RankGpus
    from .targets import RunProcess, RunTarget


class AddRun(NamedTuple):
    """A run's wish for writers, new to the fleet."""

    target: RunTarget


class RunReady(NamedTuple):
    """``target``'s run exists (its primary created it): its node writers may join."""

    target: RunTarget


class SetNodes(NamedTuple):
    """The nodes a run uses now, the primary's own node (``covered``), and, when known, the
    ranks on each node, each rank's GPU ids, the key of the ranks' attempt (their folder) and
    each rank's process id; ``only``: while that target is the run's."""

    run_id: str
    nodes: set[str]
    covered: str | None = None
    only: RunTarget | None = None
    ranks: dict[str, tuple[int, ...]] | None = None
    rank_gpus: dict[int, RankGpus] | None = None
    attempt: str | None = None
    pids: dict[int, int] | None = None


class AttemptEnded(NamedTuple):
    """A run's attempt ended (its worker group shuts down), ``failed`` or not: its ranks' console
    ends there (their last lines to the run when it failed)."""

    run_id: str
    failed: bool


class Located(NamedTuple):
    """The run's own process and its node (a Tune trial's), found on its primary's thread before
    the run exists: the node writer there reports that process's ``proc.*`` series; ``only``:
    while that target is the run's."""

    run_id: str
    process: RunProcess
    only: RunTarget | None = None


class EndHealth(NamedTuple):
    """An abort: the run's node health ends now, without its last tables, alerts or final
    judgement (wandb uploads a table as an artifact, which an exiting controller cuts short)."""

    run_id: str


class Prestart(NamedTuple):
    """Start loggers ahead on the nodes the job's ``workers`` (each asking ``per_worker``) fit."""

    use_gpu: bool
    exclude: str | None = None
    workers: int | None = None
    per_worker: dict[str, float] | None = None


class RankReport(NamedTuple):
    """Every rank's report (index = rank; empty without the straggler rule by metric), when, and
    whether it carried a checkpoint (the idle-GPU rule's set-up and save spans)."""

    run_id: str
    metrics: list[dict[str, Any]]
    at: float
    checkpoint: bool = False


class RanksFinished(NamedTuple):
    """The ranks of a run whose train function returned (Train's poll status; a rank that failed
    is not one), replacing the last such set: not judged for hangs, and progress during one."""

    run_id: str
    ranks: frozenset[int]


class Checkpointed(NamedTuple):
    """A run's attempt reported a checkpoint with its ``reports``-th report (0: an attempt started,
    from the last checkpoint): where a hang's place counts its reports from."""

    run_id: str
    reports: int


class AttemptFailed(NamedTuple):
    """A run's attempt failed (Ray's controller decided on a poll with a rank's error): its
    failure to be named in the run, from every node's facts of its ranks."""

    run_id: str
    failed: FailedAttempt


class AttemptRecovered(NamedTuple):
    """The run's ``attempt`` reported, after an earlier attempt failed: it recovered."""

    run_id: str
    attempt: int


class AwaitWriters(NamedTuple):
    """Set ``done`` once every node writer these runs want has answered its join."""

    run_ids: list[str]
    done: threading.Event


class LogRow(NamedTuple):
    """A history row of a standalone run, for the logger hosting its writer."""

    run_id: str
    metrics: dict[str, Any]


class LogArtifact(NamedTuple):
    """A checkpoint artifact of a standalone run, for the logger hosting its writer."""

    run_id: str
    checkpoint: Any
    name: str
    aliases: list[str]


class Retire(NamedTuple):
    """Finish the run's writers (bounded by ``timeout``), then ``then``, then set ``done``; a
    standalone writer ends with ``exit_code``."""

    run_id: str
    timeout: float
    then: Callable[[], None] | None
    exit_code: int | None
    done: threading.Event


class Shutdown(NamedTuple):
    """Retire every run still open and stop the thread (bounded by ``timeout``)."""

    timeout: float


class Poll(NamedTuple):
    """No command came within the poll: what is due."""


Command = (
    AddRun
    | RunReady
    | SetNodes
    | AttemptEnded
    | Located
    | EndHealth
    | Prestart
    | RankReport
    | RanksFinished
    | Checkpointed
    | AttemptFailed
    | AttemptRecovered
    | AwaitWriters
    | LogRow
    | LogArtifact
    | Retire
    | Shutdown
    | Poll
)
# Commands that change what the plan reads.
REPLANS = (AddRun, RunReady, SetNodes, Retire)
