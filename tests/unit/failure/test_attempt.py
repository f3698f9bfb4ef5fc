"""A failed attempt crosses from the Train controller to the fleet thread, and from a Train run
inside a Tune trial to the trial's run as JSON: it reads back the same."""

from __future__ import annotations

from ray_wandb_nodes._failure import FailedAttempt, RankPlace, RayPoll, RayRankError


def test_a_failed_attempt_reads_back_the_same_from_json() -> None:
    poll = RayPoll(
        (
            RayRankError(1, "ValueError", "bad shard 17", "Traceback ...", causes=("OSError: disk",)),
            RayRankError(2, "ActorDiedError", "The actor is dead ...", died=True, preempted=True),
        ),
        running=(0,),
        unanswered=(3,),
    )
    places = (("n-a", RankPlace(0, "node-a", ("0",), 11)), ("n-a", RankPlace(1, "node-a", ("1",), 12)),
              ("n-b", RankPlace(2, "node-b", (), None)), ("n-b", RankPlace(3, "node-b")))  # fmt: skip
    failed = FailedAttempt(2, True, 3, poll, places, key="run.a2.0badcafe")
    assert FailedAttempt.from_json(failed.to_json()) == failed
    assert failed.by_node() == {"n-a": (0, 1), "n-b": (2, 3)}
    assert failed.labels() == {"n-a": "node-a", "n-b": "node-b"}


def test_a_trial_s_failure_without_a_poll_or_records() -> None:
    failed = FailedAttempt(1, False, 0, None, (("n", RankPlace(0, "node")),), trial=True)
    assert FailedAttempt.from_json(failed.to_json().encode()) == failed
