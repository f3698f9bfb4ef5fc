"""faulthandler's text as typed threads and frames (real dumps captured from stuck ranks, and the
forms faulthandler prints for unusual stacks), and the training thread found in them."""

from __future__ import annotations

import threading

import pytest

from ray_wandb_nodes._hang.stacks import (
    Frame,
    ThreadStack,
    format_stack,
    parse_faulthandler,
    python_stacks,
    stack_from_data,
    stack_to_data,
    training_first,
    training_thread,
)
from tests.support.hang_fixtures import capture

RANK_FILE = "tests/support/hang_rank.py"


def _innermost_user(stack: ThreadStack) -> tuple[str, int | None]:
    frame = next(f for f in stack.frames if f.file.endswith(RANK_FILE))
    return frame.function, frame.line


# (capture, rank, the training thread's innermost frame of hang_rank.py, its innermost frame)
REAL = [
    ("python", 0, ("train_func", 63), "all_reduce"),
    ("python", 2, ("load_next_shard", 35), "load_next_shard"),
    ("native", 2, ("read_from_device", 39), "read_from_device"),
    ("all", 1, ("load_next_shard", 35), "load_next_shard"),
]


@pytest.mark.parametrize(("mode", "rank", "user", "inner"), REAL)
def test_real_dumps_parse_into_threads_with_the_training_thread_found_by_ident(
    mode: str, rank: int, user: tuple[str, int], inner: str
) -> None:
    r = next(r for r in capture(mode) if r["rank"] == rank)
    [dump] = parse_faulthandler(r["faulthandler"])
    assert len(dump) == 3  # the dump thread, the training thread, the main thread
    assert sum(t.current for t in dump) == 1
    train = training_thread(dump, r["training_ident"])
    assert train is not None and train.name is None  # faulthandler prints no names on 3.11
    assert _innermost_user(train) == user and train.frames[0].function == inner
    assert train.frames[-1] == Frame(train.frames[-1].file, train.frames[-1].line, "_bootstrap")
    assert training_first(dump, r["training_ident"])[0] is train


SYNTHETIC = """\
Thread 0x00007f0000000001 [worker-1] (most recent call first):
  File "/a/x.py", line ??? in f
  File "/a/y.py", line 3 in <module>
  ...

Current thread 0x00007f0000000002 (most recent call first):
  <no Python frame>
garbage that is not faulthandler's
Thread 0x00007f0000000001 (most recent call first):
  File "/a/x.py", line 9 in g
Stack (most recent call first):
  File "/b/z.py", line 1 in h
"""


def test_unusual_forms_and_appended_dumps() -> None:
    dumps = parse_faulthandler(SYNTHETIC)
    assert [len(d) for d in dumps] == [2, 1, 1]  # a repeated thread starts the next dump
    first, second = dumps[0]
    assert first == ThreadStack(
        0x7F0000000001, (Frame("/a/x.py", None, "f"), Frame("/a/y.py", 3, "<module>")), "worker-1", False, True
    )
    assert (second.current, second.frames, second.truncated) == (True, (), False)
    assert dumps[1][0].frames == (Frame("/a/x.py", 9, "g"),)
    assert dumps[2][0] == ThreadStack(0, (Frame("/b/z.py", 1, "h"),))
    assert parse_faulthandler("") == [] and parse_faulthandler("nothing here\n") == []


def test_in_process_stacks_name_threads_and_find_ray_trains_thread() -> None:
    started, release = threading.Event(), threading.Event()

    def train_func() -> None:
        started.set()
        release.wait(10)

    thread = threading.Thread(target=train_func, name="TrainingThread(train_func)")
    thread.start()
    started.wait(5)
    try:
        stacks = python_stacks(exclude=[threading.get_ident()])
    finally:
        release.set()
        thread.join()
    assert threading.get_ident() not in {s.ident for s in stacks}
    train = training_thread(stacks)  # no ident known: found by Ray Train's thread name
    assert train is not None and train.ident == thread.ident
    assert any(f.function == "train_func" for f in train.frames)
    assert stack_from_data(stack_to_data(train)) == train
    assert format_stack(train).startswith(f"Thread 0x{thread.ident:016x} [TrainingThread(train_func)] (most recent")
    assert training_thread([ThreadStack(1, ())]) is None
