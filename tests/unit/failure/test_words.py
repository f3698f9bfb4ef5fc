"""What a failed attempt puts into the run: the alert's words, the summary's ``failure`` fields,
the files, and with retries each attempt's alert and the recovery's (from the real gloo worlds)."""

from __future__ import annotations

from ray_wandb_nodes._failure import (
    Kind,
    OomEvidence,
    RankFailure,
    RayPoll,
    RayRankError,
    Verdict,
    choose,
    failure_notice,
    rank_failures,
    recovered_notice,
)
from ray_wandb_nodes._failure.words import TITLE_LIMIT
from tests.support.failure_fixtures import RANK_SCRIPT, nodes, places, record_error
from tests.support.source import line_of

NO_PYTHON = "died with no Python exception (a signal: SIGKILL, the kernel's OOM killer or a crash)"
KILLED = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
          "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes "
          "include: (1) the process was killed by the OOM killer due to high memory usage")  # fmt: skip


def raise_verdict() -> Verdict:
    poll = RayPoll((record_error("raise", 1),), running=(0, 2, 3))
    return choose(rank_failures(places("raise"), poll, nodes("raise")))


def kill_verdict(oom_kills: int = 0) -> Verdict:
    """The kill, its node's cgroup having counted ``oom_kills`` as rank 1 died."""
    poll = RayPoll((record_error("kill", 0), RayRankError(1, "ActorDiedError", KILLED, died=True),
                    record_error("kill", 2)), running=(3,))  # fmt: skip
    facts = nodes("kill", oom_kills={"node-0": oom_kills}, oom_at_death={1: oom_kills}, memory={"node-0": 96.0})
    return choose(rank_failures(places("kill"), poll, facts))


def test_the_alert_of_a_raise_names_rank_node_gpu_cause_and_frame() -> None:
    notice = failure_notice(raise_verdict())
    where = f"crash_rank.py:{line_of(RANK_SCRIPT, 'load_shard')} in load_shard"
    assert (notice.level, notice.title) == ("ERROR", "Rank 1 failed: ValueError: bad shard 17")
    assert notice.text.splitlines()[:2] == [
        "Rank 1 on node-0 (GPU 1) raised ValueError: bad shard 17",
        f'  at {where}: raise ValueError(f"bad shard {{index}}")  # <load_shard>',
    ]
    assert (
        "  ranks 0,2-3: a collective timed out waiting for its peers (rank 0: Timed out waiting 4000ms for recv "
        "operation to complete)" in notice.text.splitlines()
    )
    assert "What followed (consequences, not causes):" in notice.text
    assert notice.text.splitlines()[-2] == "The run failed (FailureConfig max_failures=0: no retries)."
    assert notice.summary.as_summary() == {"failure": {
        "attempt": 1, "kind": "raised", "cause": "ValueError: bad shard 17", "rank": 1, "node": "node-0",
        "gpu": "1", "where": where, "ranks": "1", "recovered": False}}  # fmt: skip


def test_the_dead_rank_s_traceback_is_a_file_of_the_run() -> None:
    notice = failure_notice(raise_verdict())
    files = dict(notice.files)
    assert notice.folder == "failures/attempt-1"
    assert set(files) == {"verdict.txt", "rank-1.txt", "consequences.txt"}
    assert "Traceback (most recent call last):" in files["rank-1.txt"]
    assert files["rank-1.txt"].rstrip().endswith("ValueError: bad shard 17")
    assert files["verdict.txt"] == notice.text + "\n"
    assert files["consequences.txt"].count("cause: RuntimeError: Timed out waiting") == 3


def test_a_kill_alert_gives_ray_s_words_and_the_node_s_memory() -> None:
    notice = failure_notice(kill_verdict())
    assert notice.title == f"Rank 1: {NO_PYTHON}"
    lines = notice.text.splitlines()
    assert lines[:4] == [
        f"Rank 1 on node-0 (GPU 1) {NO_PYTHON}",
        "  Ray: Worker exit type: SYSTEM_ERROR; Worker unexpectedly exits with a connection error code 2",
        "  the node's memory cgroup counted no OOM kill as the process died",
        "  the node's memory was 96% in use at its last sample",
    ]
    assert lines[5].startswith("  ranks 0,2-3: a collective lost its peer (rank 0: Read error [127.0.0.1]:")
    assert notice.summary.kind == "signal" and notice.summary.rank == 1


def test_an_oom_kill_alert_says_out_of_memory_with_the_cgroup_s_count() -> None:
    notice = failure_notice(kill_verdict(oom_kills=1))
    cause = "out of memory: killed by the kernel's OOM killer (the node's memory cgroup counted 1 OOM kill as it died)"
    assert notice.title == f"Rank 1: {cause}"  # 119 characters: whole
    assert notice.text.splitlines()[:3] == [
        f"Rank 1 on node-0 (GPU 1): {cause}",
        "  Ray: Worker exit type: SYSTEM_ERROR; Worker unexpectedly exits with a connection error code 2",
        "  the node's memory was 96% in use at its last sample",
    ]
    assert notice.summary.as_summary()["failure"]["kind"] == "oom"
    assert notice.summary.cause == cause


def test_the_oom_kills_counted_as_the_process_died_decide_over_the_run_s() -> None:
    base = RankFailure(1, "node-0", ("1",), Kind.SIGNAL)
    as_it_died = RankFailure(**{**base.__dict__, "kind": Kind.OOM, "oom": OomEvidence(cgroup_oom_kills=3, at_death=1)})
    assert failure_notice(choose([as_it_died])).text.splitlines()[0] == (
        "Rank 1 on node-0 (GPU 1): out of memory: killed by the kernel's OOM killer (the node's memory cgroup "
        "counted 1 OOM kill as it died)")  # fmt: skip
    earlier = RankFailure(**{**base.__dict__, "oom": OomEvidence(cgroup_oom_kills=2, at_death=0)})
    assert "  the node's memory cgroup counted no OOM kill as the process died (2 during the run)" in (
        failure_notice(choose([earlier])).text.splitlines())  # fmt: skip
    unseen = RankFailure(**{**base.__dict__, "kind": Kind.OOM, "oom": OomEvidence(cgroup_oom_kills=1)})
    assert "(the node's memory cgroup counted 1 OOM kill during the run)" in failure_notice(choose([unseen])).title
    unread = RankFailure(**{**base.__dict__, "oom": OomEvidence()})
    assert "  the node's memory cgroup could not be read" in failure_notice(choose([unread])).text.splitlines()


def test_two_causes_are_both_named() -> None:
    poll = RayPoll((record_error("two", 1), record_error("two", 3)), running=(0, 2))
    notice = failure_notice(choose(rank_failures(places("two"), poll, nodes("two"))))
    assert notice.title == "Rank 1 failed: ValueError: bad shard 17 (+1 other cause)"
    assert "Also failed at once, on their own:" in notice.text
    assert "  Rank 3 on node-1 (GPU 1) raised KeyError: 'cat'" in notice.text
    assert {name for name, _ in notice.files} >= {"rank-1.txt", "rank-3.txt"}


def test_one_exception_on_every_rank_is_one_cause() -> None:
    same = [RankFailure(r, f"node-{r // 2}", (), Kind.RAISED, error_type="KeyError", message=f"'sample_{r}'")
            for r in range(4)]  # fmt: skip
    verdict = choose(same)
    assert [c.ranks for c in verdict.causes] == [(0, 1, 2, 3)]
    assert failure_notice(verdict).title == "Ranks 0-3 failed: KeyError: 'sample_0'"


def test_with_retries_each_attempt_has_its_alert_and_the_recovery_its_own() -> None:
    first = failure_notice(raise_verdict(), attempt=1, max_failures=2, retrying=True)
    second = failure_notice(kill_verdict(), attempt=2, max_failures=2, retrying=True)
    assert first.title == "Attempt 1: Rank 1 failed: ValueError: bad shard 17"
    assert second.title.startswith("Attempt 2: Rank 1: died with no Python exception")
    assert first.title != second.title  # W&B drops an alert whose title it had within 5 minutes
    assert first.text.splitlines()[-2] == "Ray restarts the job: attempt 2 of at most 3 (FailureConfig max_failures=2)."
    assert second.folder == "failures/attempt-2"
    recovered = recovered_notice(3, second.summary)
    assert (recovered.level, recovered.title) == ("INFO", "Attempt 3 recovered")
    assert recovered.text.startswith("Training runs again after attempt 2 failed (rank 1: died with no Python")
    assert recovered.summary.as_summary()["failure"]["recovered"] is True and recovered.files == ()


def test_the_last_attempt_says_no_retries_are_left() -> None:
    notice = failure_notice(raise_verdict(), attempt=3, max_failures=2, retrying=False)
    assert notice.text.splitlines()[-2] == "No retries left (FailureConfig max_failures=2): the run failed."
    unlimited = failure_notice(raise_verdict(), attempt=7, max_failures=-1, retrying=True)
    assert "Ray restarts the job: attempt 8 (FailureConfig max_failures=-1)." in unlimited.text


def test_when_no_cause_was_seen_the_alert_says_so_and_blames_no_rank() -> None:
    poll = RayPoll((record_error("kill", 0), record_error("kill", 2)), running=(3,), unanswered=(1,))
    notice = failure_notice(choose(rank_failures(places("kill"), poll)))
    assert notice.title == "Training failed: ranks 0,2 failed after a peer; no rank's own failure was seen"
    assert notice.summary.as_summary() == {
        "failure": {"attempt": 1, "kind": "unknown", "cause": "no rank's own failure was seen", "recovered": False}
    }
    assert "raised" not in notice.text.splitlines()[0]


def test_titles_stay_short() -> None:
    long = RankFailure(0, "node-0", (), Kind.RAISED, error_type="ValueError", message="x" * 1000)
    assert len(failure_notice(choose([long])).title) == TITLE_LIMIT


def test_an_alert_of_many_causes_stays_bounded() -> None:
    causes = [RankFailure(r, f"node-{r}", (), Kind.RAISED, error_type=f"Error{r}", message="m") for r in range(300)]
    notice = failure_notice(choose(causes))
    assert notice.title == "Rank 0 failed: Error0: m (+299 other causes)"
    assert "  ... and 280 more causes (failures/attempt-1/)" in notice.text.splitlines()
    assert len(notice.text) < 4000 and len(notice.files) == 1 + 16  # verdict.txt and 16 causes' files
    assert failure_notice(choose([])).title == "Training failed: no rank's failure was seen"
