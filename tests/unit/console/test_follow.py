"""Following a rank's files as Ray leaves them: found by pid (``logs/`` or ``old/``), read across
rotation, truncation and the move to ``old/``, and far behind a bounded read that says what it skipped."""

from __future__ import annotations

import os
from pathlib import Path

from ray_wandb_nodes._console import FileFollower, Stream, worker_files
from ray_wandb_nodes._console.follow import KEEP_BYTES, MAX_BACKLOG

WID = "ab" * 28


def touch(path: Path, data: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_worker_s_files_are_found_by_its_pid_with_or_without_a_job_id(tmp_path: Path) -> None:
    out = touch(tmp_path / f"worker-{WID}-01000000-123.out")
    err = touch(tmp_path / f"worker-{WID}-123.err")  # a worker not bound to a job yet
    touch(tmp_path / f"worker-{WID}-01000000-9123.out")  # another pid that ends the same
    touch(tmp_path / f"worker-{WID}-01000000-123.out.1")  # a rotated file
    touch(tmp_path / f"python-core-worker-{WID}_123.log")  # Ray's own log of the worker
    assert worker_files(tmp_path, 123) == {Stream.OUT: out, Stream.ERR: err}
    assert worker_files(tmp_path, 999) == {}


def test_a_dead_worker_s_files_are_found_in_old(tmp_path: Path) -> None:
    out = touch(tmp_path / "old" / f"worker-{WID}-01000000-123.out")
    assert worker_files(tmp_path, 123) == {Stream.OUT: out}


def test_a_pid_used_twice_in_a_session_is_its_newest_file(tmp_path: Path) -> None:
    older = touch(tmp_path / f"worker-{'cd' * 28}-01000000-123.out")
    newer = touch(tmp_path / f"worker-{WID}-01000000-123.out")
    os.utime(older, (1_000_000, 1_000_000))
    assert worker_files(tmp_path, 123)[Stream.OUT] == newer


def test_lines_written_after_the_file_moved_to_old_are_read(tmp_path: Path) -> None:
    path = touch(tmp_path / "w.out")
    follower = FileFollower(path)
    with open(path, "ab", buffering=0) as f:
        f.write(b"one\n")
        assert follower.read().data == b"one\n"
        (tmp_path / "old").mkdir()
        os.rename(path, tmp_path / "old" / "w.out")  # Ray's log monitor, once the process is dead
        f.write(b"two\n")
        assert follower.read().data == b"two\n"


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one_from_its_start(tmp_path: Path) -> None:
    path = touch(tmp_path / "w.out")
    follower = FileFollower(path)
    with open(path, "ab", buffering=0) as f:
        f.write(b"a\n")
        assert follower.read().data == b"a\n"
        f.write(b"b\n")  # written before the rotation, not yet read
    os.rename(path, tmp_path / "w.out.1")  # as the rotating sink does
    touch(path, b"c\n")
    assert follower.read().data == b"b\nc\n"
    assert follower.rotations == 1
    assert follower.read().data == b""


def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = touch(tmp_path / "w.out", b"first line\n")
    follower = FileFollower(path)
    assert follower.read().data == b"first line\n"
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"new\n")
    assert follower.read().data == b"new\n"
    assert follower.truncations == 1


def test_a_file_that_does_not_exist_yet_is_read_once_it_does(tmp_path: Path) -> None:
    path = tmp_path / "w.out"
    follower = FileFollower(path)
    assert follower.read().data == b""
    touch(path, b"late\n")
    assert follower.read().data == b"late\n"


def test_a_restarted_logger_starts_at_the_end(tmp_path: Path) -> None:
    path = touch(tmp_path / "w.out", b"sent by the logger before its restart\n")
    follower = FileFollower(path, from_end=True)
    assert follower.read().data == b""
    with open(path, "ab") as f:
        f.write(b"new\n")
    assert follower.read().data == b"new\n"


def test_far_behind_a_read_skips_to_near_the_end_and_says_how_much(tmp_path: Path) -> None:
    size = MAX_BACKLOG + (1 << 20)
    path = touch(tmp_path / "w.out", b"x" * size)
    follower = FileFollower(path)
    read = 0
    first = follower.read()
    assert first.skipped == size - KEEP_BYTES
    read += len(first.data)
    while chunk := follower.read().data:
        read += len(chunk)
    assert read == KEEP_BYTES


def test_one_read_is_bounded(tmp_path: Path) -> None:
    path = touch(tmp_path / "w.out", b"y" * (3 << 20))
    follower = FileFollower(path)
    assert len(follower.read(limit=1 << 20).data) == 1 << 20
    assert follower.behind == 2 << 20
