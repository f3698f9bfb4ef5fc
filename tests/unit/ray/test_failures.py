"""Ray's poll read into plain values, from Ray's own classes (``WorkerGroupPollStatus``,
``WorkerStatus`` and the errors Ray puts in them), as the controller hands them to
``after_worker_group_poll_status``. The same reader ran inside a real controller for
``tests/support/crash_evidence/ray-2.60.json``."""

from __future__ import annotations

from types import SimpleNamespace

from ray.exceptions import ActorDiedError, OutOfMemoryError
from ray.train.v2._internal.exceptions import (
    UserExceptionWithTraceback,
    WorkerHealthCheckFailedError,
    WorkerHealthCheckTimeoutError,
)
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus

from ray_wandb_nodes._failure import RayRankError
from ray_wandb_nodes._ray.failures import max_failures, poll_of, rank_error, retries
from tests.support.failure_fixtures import ray_captures

TRACEBACK = 'Traceback (most recent call last):\n  File "/job/train.py", line 59, in loop\n    raise ValueError("x")\n'


def died(message: str) -> ActorDiedError:
    error = ActorDiedError()
    error.error_msg = message  # the text Ray builds from the GCS's death cause
    return error


def test_a_poll_with_a_raise_a_death_and_a_rank_whose_poll_did_not_answer() -> None:
    killed = next(e for e in ray_captures()["kill"]["poll"]["errors"] if e["died"])["message"]
    status = WorkerGroupPollStatus(
        worker_statuses={
            0: WorkerStatus(running=True, error=UserExceptionWithTraceback(ValueError("bad shard 17"), TRACEBACK)),
            1: WorkerStatus(running=False, error=WorkerHealthCheckFailedError("A worker health check failed.",
                                                                              failure=died(killed))),
            2: WorkerStatus(running=True),
            3: WorkerStatus(running=True),  # pending: Ray reports it running until its health-check timeout
        }
    )  # fmt: skip
    group = SimpleNamespace(_world_rank_to_ongoing_poll={3: object()})
    poll = poll_of(status, group)
    assert poll.errors == (
        RayRankError(0, "ValueError", "bad shard 17", TRACEBACK),
        RayRankError(1, "ActorDiedError", killed, died=True),
    )
    assert (poll.running, poll.unanswered) == ((2,), (3,))


def test_the_memory_monitor_a_timeout_and_an_answer_that_could_not_be_read() -> None:
    monitor = OutOfMemoryError("1 worker(s) were killed due to the node running low on memory.")
    oom = rank_error(1, WorkerHealthCheckFailedError("A worker health check failed.", failure=monitor))
    assert (oom.error_type, oom.died) == ("OutOfMemoryError", True)
    hung = rank_error(2, WorkerHealthCheckTimeoutError("A worker health check has been hanging for 600.00 seconds."))
    assert hung.timed_out and not hung.died
    unreadable = rank_error(3, WorkerHealthCheckFailedError("A worker health check failed.", failure=TypeError("x")))
    assert not unreadable.died and unreadable.error_type == "TypeError"  # the worker is alive: its record says why


def test_ray_2_50_s_unwrapped_raise_reads_the_same() -> None:
    # 2.50's ``WorkerGroupPollStatus.errors`` hands the wrapper; the reader reads the statuses.
    wrapped = UserExceptionWithTraceback(KeyError("cat"), TRACEBACK)
    status = WorkerGroupPollStatus(worker_statuses={0: WorkerStatus(running=True, error=wrapped)})
    assert poll_of(status).errors == (RayRankError(0, "KeyError", "'cat'", TRACEBACK),)


def test_the_failure_decision_and_the_retry_budget() -> None:
    from ray.train import FailureConfig, RunConfig
    from ray.train.v2._internal.execution.failure_handling import FailureDecision

    assert retries(FailureDecision.RETRY) and not retries(FailureDecision.RAISE)
    context = SimpleNamespace(run_config=RunConfig(failure_config=FailureConfig(max_failures=2)))
    assert max_failures(context) == 2
    assert max_failures(SimpleNamespace(run_config=RunConfig())) == 0
