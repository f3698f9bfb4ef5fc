"""A DataLoader worker's failure named as the worker's, from torch's own texts (captured by
``python -m tests.support.dataloader_capture``: a worker whose dataset raised, one SIGKILLed,
one dead of SIGBUS), through the table, the choice and the alert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ray_wandb_nodes._failure import (
    FailureNotice,
    Kind,
    NodeFacts,
    RankFailure,
    RankPlace,
    RankRecord,
    RayPoll,
    RayRankError,
    Shape,
    choose,
    failure_notice,
    rank_failures,
)
from ray_wandb_nodes._failure.dataloader import worker_failure
from ray_wandb_nodes._failure.texts import causes_of
from tests.support.failure_fixtures import EVIDENCE
from tests.support.source import line_of

SCRIPT = Path(__file__).resolve().parents[2] / "support" / "dataloader_capture.py"


def captured(mode: str) -> RankRecord:
    data = json.loads((EVIDENCE / "dataloader.json").read_text())
    record = next(c["record"] for c in data["captures"] if c["mode"] == mode)
    return RankRecord.from_json(json.dumps(record))


def notice_of(record: RankRecord, by_ray: bool = False) -> tuple[RankFailure, FailureNotice]:
    place = RankPlace(1, "node-0", ("1",), record.pid)
    if by_ray:  # Ray's account alone: the exception's type, message and Ray's traceback text
        error = RayRankError(1, record.error_type, record.message, record.traceback, causes=causes_of(record.traceback))
        failures = rank_failures([place], RayPoll((error,), running=(0,)))
    else:
        failures = rank_failures(
            [place], RayPoll((), running=(0,), unanswered=(1,)), {"node-0": NodeFacts((record,), (), 0)}
        )
    verdict = choose(failures)
    assert verdict.first is not None and verdict.first.ranks == (1,) and verdict.consequences == ()
    return verdict.first.failure, failure_notice(verdict)


@pytest.mark.parametrize("by_ray", [False, True])
def test_a_worker_s_exception_is_named_with_the_worker_s_frame(by_ray: bool) -> None:
    record = captured("raise")
    assert record.message.startswith("Caught ValueError in DataLoader worker process 0.")
    failure, notice = notice_of(record, by_ray)
    assert (failure.kind, failure.error_type, failure.message) == (
        Kind.RAISED, "ValueError in DataLoader worker 0", "bad sample 17")  # fmt: skip
    assert failure.frame is not None and failure.frame.function == "__getitem__"
    assert failure.frame.place == f"dataloader_capture.py:{line_of(SCRIPT, 'bad_sample')}"
    assert notice.title == "Rank 1 failed: ValueError in DataLoader worker 0: bad sample 17"
    assert notice.text.splitlines()[1].startswith(f"  at dataloader_capture.py:{line_of(SCRIPT, 'bad_sample')} in")
    assert notice.summary.cause == "ValueError in DataLoader worker 0: bad sample 17"


@pytest.mark.parametrize("by_ray", [False, True])
def test_a_worker_killed_is_out_of_memory(by_ray: bool) -> None:
    record = captured("kill")
    # torch's texts; the main process's read of the dead worker's queue failed first, with "Connection
    # reset by peer" (a context the old words-anywhere rule took for a peer's collective).
    assert "is killed by signal: Killed." in record.message and any("reset by peer" in c for c in record.causes)
    failure, notice = notice_of(record, by_ray)
    assert (failure.kind, failure.shape) == (Kind.OOM, Shape.OWN)
    assert "out of memory" in failure.message and "OOM killer" in failure.message
    assert (
        notice.title.startswith("Rank 1: DataLoader worker (pid ")
        and "was killed by SIGKILL: out of memory" in notice.title
    )
    assert notice.summary.kind == "oom"
    where = f"at dataloader_capture.py:{line_of(SCRIPT, 'for_batch')} in train_loop"
    assert notice.text.splitlines()[1].startswith(f"  {where}")


@pytest.mark.parametrize("by_ray", [False, True])
def test_a_worker_dead_of_a_bus_error_is_out_of_shared_memory(by_ray: bool) -> None:
    record = captured("bus")
    assert "Bus error. It is possible that dataloader's workers are out of shared memory" in record.traceback
    failure, notice = notice_of(record, by_ray)
    assert failure.kind is Kind.OOM and failure.message.endswith("died of a bus error: out of shared memory (/dev/shm)")
    assert "out of shared memory (/dev/shm)" in notice.title


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("DataLoader worker (pid 812) is killed by signal: Segmentation fault. ",
         (Kind.RAISED, "DataLoader worker (pid 812) is killed by signal: Segmentation fault.")),
        ("DataLoader worker (pid(s) 812) exited unexpectedly", None),  # no word of how: left as it is
        ("bad shard 17", None),
        ("Caught ValueError in DataLoader worker process 0.", None),  # no worker's traceback: left as it is
    ],
)  # fmt: skip
def test_other_texts(message: str, expected: tuple[Kind, str] | None) -> None:
    worker = worker_failure("RuntimeError", message)
    assert (None if worker is None else (worker.kind, worker.message)) == expected


def test_two_ranks_failing_in_different_workers_alike_are_one_cause() -> None:
    record = captured("raise")
    other = RankRecord(**{**record.__dict__, "rank": 2, "pid": record.pid + 1,
                          "message": record.message.replace("worker process 0", "worker process 3")})  # fmt: skip
    places = [RankPlace(1, "node-0", (), record.pid), RankPlace(2, "node-0", (), other.pid)]
    facts = {"node-0": NodeFacts((record, other), (), 0)}
    verdict = choose(rank_failures(places, RayPoll((), unanswered=(1, 2)), facts))
    assert [c.ranks for c in verdict.causes] == [(1, 2)]
