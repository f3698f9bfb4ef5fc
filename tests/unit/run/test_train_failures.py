"""A Train run's failed attempts as its controller's hooks show them (``_run.train_failures``), fed
Ray's own poll, error and decision classes in the order the controller calls its hooks: the first
poll with an error is the one Ray decides on, a decision with no failing poll before it is no
rank's failure, a retry makes the next attempt current and its first report its recovery."""

from __future__ import annotations

from types import SimpleNamespace

from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus

from ray_wandb_nodes._failure import RankPlace
from ray_wandb_nodes._ray import Placement
from ray_wandb_nodes._run.train_failures import AttemptFailures, rank_places

PLACES = [Placement(1, "n-b", "host-b", ("0",), 12), Placement(0, "n-a", "host-a", (), 11)]


def poll(**ranks: BaseException | None) -> WorkerGroupPollStatus:
    """``r0=None`` (running), ``r1=error``."""
    return WorkerGroupPollStatus(
        worker_statuses={int(k[1:]): WorkerStatus(running=v is None, error=v) for k, v in ranks.items()}
    )


def raised(message: str) -> UserExceptionWithTraceback:
    return UserExceptionWithTraceback(ValueError(message), f"ValueError: {message}\n")


def test_the_poll_ray_decides_on_is_the_first_with_an_error_and_a_retry_starts_the_next_attempt() -> None:
    failures = AttemptFailures(max_failures=1)
    failures.new_group()
    failures.polled(poll(r0=None, r1=None))
    assert failures.reported() is None  # the first attempt's reports recover nothing
    failures.polled(poll(r0=None, r1=raised("bad shard 17")))
    failures.polled(poll(r0=raised("later"), r1=raised("bad shard 17")))  # after the decision's poll: not it
    failed = failures.decided(FailureDecision.RETRY, PLACES, key="run.a1.0badcafe")
    assert failed is not None
    assert (failed.attempt, failed.retrying, failed.max_failures, failed.key) == (1, True, 1, "run.a1.0badcafe")
    assert failed.poll is not None and [(e.rank, e.message) for e in failed.poll.errors] == [(1, "bad shard 17")]
    assert failed.poll.running == (0,)
    assert [place.rank for _, place in failed.places] == [0, 1]

    failures.new_group()  # the retry's worker group
    assert failures.attempt == 2
    assert failures.reported() == 2 and failures.reported() is None  # its first report only
    failures.polled(poll(r0=None, r1=raised("again")))
    last = failures.decided(FailureDecision.RAISE, PLACES, key="run.a2.0badcafe")
    assert last is not None and (last.attempt, last.retrying) == (2, False)
    assert failures.attempt == 2 and failures.reported() is None


def test_a_decision_with_no_failing_poll_before_it_is_no_rank_s_failure() -> None:
    """A worker group that could not start (Ray's ``ControllerError``) reaches the same hook."""
    failures = AttemptFailures(max_failures=-1)
    failures.polled(poll(r0=None))
    assert failures.decided(FailureDecision.RETRY, PLACES, key=None) is None
    assert failures.attempt == 1 and failures.reported() is None


def test_each_rank_s_place_names_its_node_as_its_writer_does() -> None:
    places = rank_places(PLACES)
    assert [n for n, _ in places] == ["n-a", "n-b"]
    assert [(p.rank, p.gpus, p.pid) for _, p in places] == [(0, (), 11), (1, ("0",), 12)]
    assert all(isinstance(p, RankPlace) and p.node for _, p in places)


def test_the_pending_polls_of_the_worker_group_are_not_read_as_running() -> None:
    failures = AttemptFailures()
    group = SimpleNamespace(_world_rank_to_ongoing_poll={2: object()})
    failures.polled(poll(r0=raised("x"), r1=None, r2=None), group)
    failed = failures.decided(FailureDecision.RAISE, PLACES, key="k")
    assert failed is not None and failed.poll is not None
    assert (failed.poll.running, failed.poll.unanswered) == ((1,), (2,))


def test_the_failed_attempts_and_the_recovery_go_to_the_sink_in_order() -> None:
    """The sink is the callback's run, or the relay to the Tune trial's run it runs in."""
    sent: list[object] = []
    sink = SimpleNamespace(attempt_failed=sent.append, attempt_recovered=sent.append)
    failures = AttemptFailures(max_failures=1, sink=sink)
    failures.polled(poll(r0=None, r1=raised("bad shard 17")))
    first = failures.decided(FailureDecision.RETRY, PLACES, key="k1")
    failures.new_group()
    failures.reported()
    failures.reported()
    failures.polled(poll(r0=raised("again"), r1=None))
    last = failures.decided(FailureDecision.RAISE, PLACES, key="k2")
    assert sent == [first, 2, last] and first is not None and last is not None


def test_the_attempt_s_failure_is_one_state_from_its_failing_poll_to_its_group_s_end() -> None:
    """What the worker group's shutdown hook reads (its ranks' last lines to the run) is the poll
    Ray decided on: failed from that poll, through the decision, until the next group or the
    replaced replica group; a healthy attempt never failed."""
    failures = AttemptFailures(max_failures=2)
    failures.new_group()
    failures.polled(poll(r0=None, r1=None))
    assert not failures.failed  # a healthy poll
    failures.polled(poll(r0=None, r1=raised("bad shard 17")))
    assert failures.failed
    first = failures.decided(FailureDecision.RETRY, PLACES, key="k1")
    assert failures.failed and first is not None  # the shutdown after the decision still sees it
    failures.new_group()
    assert not failures.failed
    failures.polled(poll(r0=raised("replica"), r1=None))
    second = failures.decided(FailureDecision.RETRY, PLACES, key="k2")
    assert second is not None and second.poll is not None
    assert [e.message for e in second.poll.errors] == ["replica"]
    failures.replaced()  # a replica group replaced (Ray 2.56+): the attempt goes on
    assert not failures.failed
    assert failures.decided(FailureDecision.RAISE, PLACES, key="k3") is None  # no failing poll since
