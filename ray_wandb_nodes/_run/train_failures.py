"""A Train run's failed attempts as its controller's hooks show them, on the controller.

Ray's controller decides on the first poll of the workers that holds an error
(``after_worker_group_poll_status``, then ``before_controller_execute_failure_decision`` in the
same turn of its loop): this keeps what that poll said of each rank (attribute reads only,
``_ray.failures.poll_of``) and, at the decision, hands the run one typed value
(``_failure.FailedAttempt``: the poll, where each rank ran, what Ray decided, the attempt's
folder), for the fleet thread to ask the nodes and name the first death. A decision with no
failing poll before it (a worker group that could not start: a ``ControllerError``) is not a
rank's failure and is left to Ray's own words. After a retry, the first report of every rank says
which attempt recovered. Nothing here blocks or raises into Ray (the callback guards each hook).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .._failure import FailedAttempt, RankPlace, RayPoll
from .._gpu_ids import named
from .._ray import Placement
from .._ray.failures import poll_failed, poll_of, retries
from .._wandb.naming import LABELS


def rank_places(placements: Iterable[Placement]) -> tuple[tuple[str, RankPlace], ...]:
    """(node id, place) of each rank, by rank: its node's label (as its writer's), GPUs and process."""
    return tuple(
        (p.node_id, RankPlace(p.rank, LABELS.label(p.hostname, p.node_id), named(p.gpu_ids), p.pid))
        for p in sorted(placements, key=lambda p: p.rank)
    )


class FailureSink(Protocol):
    """Where a Train run's failed attempts and recoveries go: its own run (``TrainRun``), or the
    run of the Tune trial it runs in (``TrialRelay``)."""

    def attempt_failed(self, failed: FailedAttempt) -> None: ...

    def attempt_recovered(self, attempt: int) -> None: ...


class AttemptFailures:
    """The current attempt's failure, as Train's hooks show it (on the controller's loop), handed
    to ``sink`` (None: nowhere, the callback logs nothing)."""

    def __init__(self, max_failures: int = 0, sink: FailureSink | None = None) -> None:
        self.max_failures = max_failures  # FailureConfig.max_failures (-1: without limit)
        self.sink = sink
        self.attempt = 1  # the current attempt (1: the first)
        # The first poll with an error, this attempt: the one Ray decides on, and the one state of
        # the attempt's failure (kept until its worker group, or its replaced replica group, ends).
        self._poll: RayPoll | None = None
        self._recovering = False  # a retry started: its first report says it recovered

    @property
    def failed(self) -> bool:
        """A poll of the current worker group held a rank's error (its ranks' last lines go to the
        run as the attempt ends)."""
        return self._poll is not None

    def new_group(self) -> None:
        """A worker group starts: its attempt has seen no failing poll yet."""
        self._poll = None

    def replaced(self) -> None:
        """A failed replica group was replaced (Ray 2.56+): its ranks ended with their processes,
        and the attempt goes on with no failing poll."""
        self._poll = None

    def polled(self, status: Any, worker_group: Any = None) -> None:
        """Train's poll of the workers: the first one with a rank's error is the one Ray decides on."""
        if self._poll is None and poll_failed(status):
            self._poll = poll_of(status, worker_group)

    def decided(self, decision: Any, placements: Iterable[Placement], key: str | None) -> FailedAttempt | None:
        """Ray's failure decision on the failing poll (each is followed by a new worker group, a
        replaced replica group or the run's end): the failed attempt (None: no rank failed, a
        start that did not happen); a retry makes the next attempt the current one."""
        poll = self._poll
        if poll is None:
            return None
        retrying = retries(decision)
        failed = FailedAttempt(self.attempt, retrying, self.max_failures, poll, rank_places(placements), key)
        if retrying:
            self.attempt += 1
            self._recovering = True
        if self.sink is not None:
            self.sink.attempt_failed(failed)
        return failed

    def reported(self) -> int | None:
        """A report of every rank: the attempt that recovered, on its first report after a retry."""
        if not self._recovering:
            return None
        self._recovering = False
        if self.sink is not None:
            self.sink.attempt_recovered(self.attempt)
        return self.attempt
