"""A rank's own record of its end, from real processes: one whose train function raises (run by
Ray Train's ``ThreadRunner`` with the plugin's hook) and one SIGKILLed, watched from outside as
its node's logger watches it; the hook never changes what Ray gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ray_wandb_nodes._failure import (
    DeathWatch,
    Kind,
    NodeFacts,
    RankPlace,
    RankRecorder,
    RayPoll,
    RecordKind,
    choose,
    rank_failures,
    read_records,
)
from ray_wandb_nodes._failure.record import MAX_TRACEBACK, record_of
from tests.support.source import line_of

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tests" / "support" / "crash_one.py"


def start(mode: str, directory: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tests.support.crash_one", mode, str(directory)]
    return subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, -9), err
    return proc.returncode, out


def test_a_train_function_that_raises_leaves_its_record_and_ray_gets_its_error_unchanged(tmp_path: Path) -> None:
    hooked, bare = tmp_path / "hooked", tmp_path / "bare"
    hooked.mkdir()
    bare.mkdir()
    before = time.monotonic_ns()
    procs = [start("raise", hooked), start("bare", bare)]
    (_, with_hook), (_, without) = (finish(p) for p in procs)
    after = time.monotonic_ns()
    [record] = read_records(hooked)
    assert (record.rank, record.kind, record.error_type, record.message) == (3, RecordKind.RAISED, "ValueError",
                                                                             "bad shard 17")  # fmt: skip
    assert record.frame is not None and (record.frame.function, record.frame.line) == (
        "load_shard",
        line_of(SCRIPT, "load_shard"),
    )
    assert record.causes == ("OSError: shard 17 is truncated",)
    assert before <= record.mono_ns <= after  # this host's monotonic clock, the beacons'
    assert record.thread.startswith("TrainingThread(")
    assert "raise ValueError" in record.traceback and "OSError: shard 17 is truncated" in record.traceback
    assert read_records(bare) == []
    ray_hooked, ray_bare = json.loads(with_hook), json.loads(without)
    assert ray_hooked == ray_bare  # what Ray keeps of the error is the same with the hook as without
    assert (ray_hooked["type"], ray_hooked["base"], ray_hooked["base_message"]) == (
        "UserExceptionWithTraceback", "ValueError", "bad shard 17")  # fmt: skip


def test_a_sigkilled_rank_leaves_no_record_and_its_node_sees_it_gone(tmp_path: Path) -> None:
    proc = start("kill", tmp_path)
    watch = DeathWatch()
    while proc.poll() is None:
        watch.look([(3, proc.pid)])
        time.sleep(0.01)
    code, _ = finish(proc)
    watch.look([(3, proc.pid)])
    assert code == -9 and read_records(tmp_path) == []
    [gone] = watch.gone()
    assert (gone.rank, gone.pid) == (3, proc.pid) and gone.alive_ns < gone.gone_ns
    facts = {"node-a": NodeFacts(tuple(read_records(tmp_path)), tuple(watch.gone()), 0, 55.0)}
    verdict = choose(rank_failures([RankPlace(3, "node-a", ("3",), proc.pid)], RayPoll((), unanswered=(3,)), facts))
    assert verdict.first is not None and verdict.first.failure.kind is Kind.SIGNAL
    assert verdict.first.failure.oom is not None and verdict.first.failure.oom.memory_percent == 55.0


def test_a_hook_callback_that_raises_changes_nothing_for_ray() -> None:
    pytest.importorskip("ray")
    from ray.train.v2._internal.execution.worker_group.thread_runner import ThreadRunner

    from ray_wandb_nodes._ray.failures import hook_train_errors

    seen: list[BaseException] = []

    def broken(e: BaseException) -> None:
        seen.append(e)
        raise RuntimeError("the recorder broke")

    assert hook_train_errors(broken)
    try:
        runner = ThreadRunner()
        runner.run(lambda: 1 / 0)
        while runner.is_running():
            time.sleep(0.01)
        error = runner.get_error()
        assert type(getattr(error, "_base_exc", None)) is ZeroDivisionError
        assert "ZeroDivisionError: division by zero" in str(error)
        assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)
    finally:
        hook_train_errors(lambda e: None)


def test_a_recorder_that_cannot_write_says_so_and_does_not_raise(tmp_path: Path) -> None:
    recorder = RankRecorder(tmp_path / "missing", 0)
    assert recorder.raised(ValueError("x")) is False and recorder.stopped() is False
    assert RankRecorder(tmp_path, 0).stopped() is True
    assert [r.kind for r in read_records(tmp_path)] == [RecordKind.STOPPED]


def test_a_huge_traceback_keeps_its_head_and_tail() -> None:
    try:
        raise ValueError("x" * (MAX_TRACEBACK * 2))
    except ValueError as e:
        record = record_of(0, e)
    assert len(record.traceback) < MAX_TRACEBACK + 200 and "characters left out" in record.traceback
    assert len(record.message) <= 4000


def test_torn_or_foreign_files_are_not_records(tmp_path: Path) -> None:
    (tmp_path / "rank-0.1.failure.json").write_text('{"rank": 0, "pi')
    (tmp_path / "rank-1.2.failure.json").write_text("[]")
    assert read_records(tmp_path) == []
