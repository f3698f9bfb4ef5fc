"""Ray's internals about a failing rank, read into plain values (:class:`RayPoll`, :class:`RayRankError`)
that ``_failure`` judges; each name with the releases it was read from, 2.50.1, 2.55.1 and 2.60.0:

- ``ray.train.v2._internal.execution.worker_group.thread_runner``: ``ThreadRunner._run_target``
  catches what the train function raises and hands it to ``construct_user_exception_with_traceback``
  (imported by name into the module: thread_runner.py:8, called at :51 in 2.50.1, :46 in 2.55.1
  and 2.60.0), in the training thread, inside its ``except`` block: the moment and the exception
  object, before Ray keeps only a traceback's text. :func:`hook_train_errors` wraps that name.
- ``WorkerGroupPollStatus.worker_statuses`` (``worker_group/poll.py``, 2.50-2.60): each rank's
  ``WorkerStatus(running, error)``. The error is ``UserExceptionWithTraceback`` (``_base_exc``,
  ``_traceback_str``) for a raise; ``WorkerHealthCheckFailedError`` (``health_check_failure``: an
  ``ActorDiedError``, an ``OutOfMemoryError`` from Ray's memory monitor, or a failure to
  deserialize the poll's answer) when the poll task failed; ``WorkerHealthCheckTimeoutError``
  when it hung past ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``. ``WorkerGroupPollStatus.errors``
  unwraps the raise from 2.55 only (2.50 hands the wrapper): read ``worker_statuses`` instead.
  ``RayActorError.preempted`` (2.50-2.60): a node reclaimed.
- ``WorkerGroup._world_rank_to_ongoing_poll`` (2.50.1 worker_group.py:165, 2.55.1 :175,
  2.60.0 :169): the ranks whose poll task has not answered; Ray reports them ``running`` with no
  error until its health-check timeout, so only this tells them from the ranks that answered.
- ``WorkerStatus.error`` (2.50-2.60): :func:`poll_failed` reads it on every poll, since
  ``WorkerGroupPollStatus.errors`` builds a dict each call from 2.55.
- Tune (2.50-2.60): ``Trial.pickled_error_file`` (the ``RayTaskError`` or ``RayActorError`` Tune
  pickled when the trial failed, ``Trial.handle_error``), ``Trial.error_file`` (its text, every
  failure appended), ``Trial.num_failures`` and ``Trial.max_failures``; ``RayTaskError.cause`` and
  its text (the remote traceback): :func:`trial_error`.
- ``FailureDecision`` (``failure_handling/failure_policy.py``, 2.50-2.60): ``RETRY``, ``RAISE``,
  ``NOOP``, given to ``before_controller_execute_failure_decision``;
  ``RunConfig.failure_config.max_failures`` (``train/v2/api/config.py``, never None past
  ``__post_init__``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._mask import mask


@dataclass(frozen=True)
class RayRankError:
    """What Ray's controller said of one rank that failed, read from its poll (this module)."""

    rank: int
    error_type: str  # the train function's exception's type, or Ray's for a death
    message: str
    traceback: str = ""  # Ray's traceback text of a raise (the user's frames)
    died: bool = False  # the process is gone (Ray's health check failed: ActorDiedError, OutOfMemoryError)
    preempted: bool = False  # Ray says its node was preempted
    timed_out: bool = False  # Ray's health check of it timed out
    causes: tuple[str, ...] = ()  # the exception's causes (``__cause__``/``__context__``), "Type: message" each


@dataclass(frozen=True)
class RayPoll:
    """The poll of the workers on which Ray's controller decided the job failed."""

    errors: tuple[RayRankError, ...]
    running: tuple[int, ...] = ()  # ranks that answered running, with no error
    unanswered: tuple[int, ...] = ()  # ranks whose poll had not answered (dead, hung or slow)


def type_name(exc: BaseException) -> str:
    """``ValueError``; ``torch.OutOfMemoryError`` (a builtin's module left out)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


_HOOKED = "construct_user_exception_with_traceback"
_on_error: Callable[[BaseException], object] | None = None


def hook_train_errors(on_error: Callable[[BaseException], object]) -> bool:
    """Call ``on_error(exc)`` in a train worker whenever its train function raises ``exc``, before
    Ray takes the exception (on its training thread). ``on_error`` must not raise; what it
    raises is dropped, and Ray gets the exception as it would have. Once a process (a second call
    only changes the callback); whether this Ray has the place to hook."""
    global _on_error
    try:
        from ray.train.v2._internal.execution.worker_group import thread_runner as runner
    except ImportError:
        return False
    original = getattr(runner, _HOOKED, None)
    if original is None:
        return False
    _on_error = on_error
    if getattr(original, "_rwn_hook", False):
        return True

    def construct(e: BaseException, *args: Any, **kwargs: Any) -> Any:
        try:
            callback = _on_error
            if callback is not None:
                callback(e)
        except Exception:  # noqa: BLE001 - never in the way of the user's exception
            pass
        return original(e, *args, **kwargs)

    construct._rwn_hook = True  # type: ignore[attr-defined]
    setattr(runner, _HOOKED, construct)
    return True


def poll_failed(status: Any) -> bool:
    """Whether a poll (a ``WorkerGroupPollStatus``) holds a rank's error."""
    return any(worker.error is not None for worker in status.worker_statuses.values())


def poll_of(status: Any, worker_group: Any = None) -> RayPoll:
    """What Ray's controller saw of each rank on a poll (a ``WorkerGroupPollStatus``): the ranks
    that failed, those that answered running, those whose poll had not answered (read from
    ``worker_group`` where given: the one ``after_worker_group_start`` received)."""
    pending = set(getattr(worker_group, "_world_rank_to_ongoing_poll", None) or ())
    errors, running = [], []
    for rank, worker in sorted(status.worker_statuses.items()):
        error = worker.error
        if error is not None:
            errors.append(rank_error(int(rank), error))
        elif rank not in pending:
            running.append(int(rank))
    return RayPoll(tuple(errors), tuple(running), tuple(sorted(int(r) for r in pending)))


def rank_error(rank: int, error: BaseException) -> RayRankError:
    """One rank's error as Ray's poll holds it (see the module's docstring for the shapes)."""
    name = type(error).__name__
    if hasattr(error, "_base_exc"):  # UserExceptionWithTraceback: the train function raised
        base = error._base_exc
        return RayRankError(rank, type_name(base), _text(base), mask(str(getattr(error, "_traceback_str", ""))))
    if name == "WorkerHealthCheckTimeoutError":
        return RayRankError(rank, name, _text(error), timed_out=True)
    failure = getattr(error, "health_check_failure", None)
    if failure is not None:
        died = _is_death(failure)
        return RayRankError(rank, type(failure).__name__, _text(failure if died else error), died=died,
                            preempted=bool(getattr(failure, "preempted", False)))  # fmt: skip
    return RayRankError(rank, type_name(error), _text(error))  # a raise that Ray did not wrap


def trial_error(trial: Any, rank: int = 0) -> RayRankError | None:
    """A Tune trial's last error as ``rank``'s, read from the files Tune wrote when the trial failed
    (the pickled exception, else the text of the last failure); None where there is none."""
    path = getattr(trial, "pickled_error_file", None)
    if path:
        try:
            from ray import cloudpickle

            with open(path, "rb") as f:
                error = cloudpickle.load(f)
            if isinstance(error, BaseException):
                return task_error(rank, error)
        except Exception:  # noqa: BLE001 - an exception that does not unpickle here: its text
            pass
    path = getattr(trial, "error_file", None)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    last = text.rsplit("Failure # ", 1)[-1].split("\n", 1)[-1].strip()  # "Failure # N (occurred at ...)\n<text>"
    return RayRankError(rank, "Error", last.splitlines()[-1] if last else "", last) if last else None


def task_error(rank: int, error: BaseException) -> RayRankError:
    """A Ray task's error as ``rank``'s: a ``RayTaskError`` as its cause (type, message) with Ray's
    text (the remote traceback); a dead actor as a death; anything else as it is."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RayTaskError):
        cause = getattr(error, "cause", None)
        text = _text(error)
        if isinstance(cause, BaseException):
            if _is_death(cause):
                return RayRankError(rank, type(cause).__name__, _text(cause), died=True,
                                    preempted=bool(getattr(cause, "preempted", False)))  # fmt: skip
            return RayRankError(rank, type_name(cause), _text(cause), text)
        return RayRankError(rank, type_name(error), text, text)
    if _is_death(error):
        return RayRankError(rank, type(error).__name__, _text(error), died=True,
                            preempted=bool(getattr(error, "preempted", False)))  # fmt: skip
    return rank_error(rank, error)


def _is_death(failure: BaseException) -> bool:
    from ray.exceptions import OutOfMemoryError, RayActorError

    return isinstance(failure, (RayActorError, OutOfMemoryError))


def _text(e: BaseException) -> str:
    """``str(e)``, its secrets masked (``_mask``): what the run shows of a rank's error."""
    try:
        return mask(str(e))
    except Exception:  # noqa: BLE001
        return f"<{type(e).__name__}>"


def retries(failure_decision: Any) -> bool:
    """Whether Ray's failure policy decided to retry (``FailureDecision.RETRY``)."""
    return getattr(failure_decision, "value", str(failure_decision)) == "RETRY"


def max_failures(train_run_context: Any) -> int:
    """``FailureConfig.max_failures`` of the run (-1: without limit; 0 where not readable)."""
    config = getattr(getattr(train_run_context, "run_config", None), "failure_config", None)
    return int(getattr(config, "max_failures", 0) or 0)
