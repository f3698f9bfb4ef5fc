"""The node logger's console thread against real rank processes that write as Ray's workers do
(``tests/support/console_rank.py``: their descriptors 1 and 2 on Ray's file names): a rank that
raises and one killed by SIGKILL have their last lines, the traceback with them, in the console
when their attempt fails; a healthy attempt sends none of another rank's lines; rank 0 is live."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._console import (
    ConsoleLine,
    ConsoleTailer,
    Kind,
    RankBudget,
    RankConsole,
    RankProcess,
    Stream,
    plan_console,
)
from ray_wandb_nodes._warn import Warner
from tests.support.console_rank import worker_file
from tests.support.wait import wait_until

WAIT_S = 30.0  # a process's start and end on 2 loaded cores: seconds at worst, waited on as events


class Collected:
    """A sink that keeps every line it is handed."""

    def __init__(self, fail: bool = False) -> None:
        self.lines: list[ConsoleLine] = []
        self._lock = threading.Lock()
        self.fail = fail

    def __call__(self, lines: Sequence[ConsoleLine]) -> None:
        if self.fail:
            raise ConnectionError("wandb is gone")
        with self._lock:
            self.lines += lines

    def texts(self, rank: int, stream: Stream | None = None) -> list[str]:
        with self._lock:
            return [x.text for x in self.lines if x.rank == rank and stream in (None, x.stream)]


class Ranks:
    """Rank processes in one logs folder; ``go()`` lets them end as each was told."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, end: str, *args: str) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.console_rank", str(self.logs), str(self.logs / "go"), end, *args]
        )
        self.procs.append(proc)
        wait_until(lambda: (self.logs / f"{proc.pid}.started").exists(), WAIT_S, f"rank process {proc.pid} to start")
        return proc.pid

    def go_and_wait(self) -> None:
        (self.logs / "go").touch()
        for proc in self.procs:
            proc.wait(WAIT_S)


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Ranks]:
    r = Ranks(tmp_path)
    yield r
    for proc in r.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def tailer(ranks: Ranks, sink: Collected, mode: Any = "rank0", world: int = 2, **kw: Any) -> ConsoleTailer:
    return ConsoleTailer(plan_console(mode, world, 1), ranks.logs, sink, poll_s=0.05, **kw).start()


def end(t: ConsoleTailer, failed: bool) -> None:
    t.end_attempt(failed)
    assert t.finish(failed, timeout=WAIT_S)


def test_a_rank_that_raises_has_its_last_lines_and_traceback_in_the_console_when_its_attempt_fails(
    ranks: Ranks,
) -> None:
    sink = Collected()
    t = tailer(ranks, sink)
    pid0, pid1 = ranks.start("ok"), ranks.start("raise")
    t.watch([RankProcess(0, pid0), RankProcess(1, pid1)])
    wait_until(lambda: "stdout line of its own" in sink.texts(0), WAIT_S, "rank 0's lines, live")
    ranks.go_and_wait()
    assert sink.texts(1) == []  # the default keeps another rank's lines until its attempt ends
    end(t, failed=True)
    one = sink.texts(1)
    assert {f"hello from pid {pid1}", f"a warning from pid {pid1}", "100%|##########|", "about to fail"} <= set(one)
    # Each stream in order (the two streams' lines interleave as they are read, not as written).
    err = sink.texts(1, Stream.ERR)
    assert err[err.index("Traceback (most recent call last):") :][-1] == "ValueError: bad shard 17"
    assert [x for x in err if x.startswith("  File ")][-1].endswith("in main")
    assert sink.texts(1, Stream.OUT)[-1] == "about to fail"
    assert sink.texts(0, Stream.OUT)[-1] == "the last line, exit 0"


def test_a_rank_killed_by_sigkill_has_its_last_line_in_the_console(ranks: Ranks) -> None:
    sink = Collected()
    t = tailer(ranks, sink)
    pid1 = ranks.start("kill")
    t.watch([RankProcess(1, pid1)])
    ranks.go_and_wait()
    end(t, failed=True)
    assert sink.texts(1, Stream.OUT)[-1] == "the last line before SIGKILL"


def test_a_healthy_attempt_sends_rank_0_live_and_nothing_of_the_others(ranks: Ranks) -> None:
    sink = Collected()
    t = tailer(ranks, sink)
    pid0, pid1 = ranks.start("ok"), ranks.start("ok")
    t.watch([RankProcess(0, pid0), RankProcess(1, pid1)])
    ranks.go_and_wait()
    end(t, failed=False)
    assert sink.texts(1) == []
    zero = sink.texts(0)
    # The print Ray Train 2.60 writes to both streams is there once; the bar as its last state.
    assert zero.count(f"hello from pid {pid0}") == 1
    assert zero.count("100%|##########|") == 1 and not any("\r" in x or "50%" in x for x in zero)
    assert set(zero) == {
        f"hello from pid {pid0}",
        f"a warning from pid {pid0}",
        "100%|##########|",
        "stdout line of its own",
        "the last line, exit 0",
    }
    assert not any(x.startswith(":") for x in zero)  # Ray's markers


def test_a_rank_that_died_before_it_was_watched_is_read_all_the_same(ranks: Ranks) -> None:
    sink = Collected()
    pid1 = ranks.start("raise")
    ranks.go_and_wait()
    t = tailer(ranks, sink)
    t.watch([RankProcess(1, pid1)])
    end(t, failed=True)
    assert sink.texts(1, Stream.ERR)[-1] == "ValueError: bad shard 17"


def test_all_sends_every_rank_live_within_its_share_then_its_last_lines(ranks: Ranks) -> None:
    sink = Collected()
    plan = plan_console("all", 2, 1)
    pid0, pid1 = ranks.start("ok"), ranks.start("flood", str(plan.live_other + 1_000))
    t = tailer(ranks, sink, mode="all")
    t.watch([RankProcess(0, pid0), RankProcess(1, pid1)])
    ranks.go_and_wait()
    end(t, failed=False)
    one = [x for x in sink.lines if x.rank == 1]
    notes = [x.text for x in one if x.kind is Kind.NOTE]
    assert notes[0].startswith(f"the run's console share of this rank ({plan.live_other:,} lines) is spent")
    assert notes[1].endswith(f"its last {plan.tail} follow")
    assert one[-1].text == "the last line, exit 0"
    assert len([x for x in one if x.kind is Kind.TEXT]) == plan.live_other + plan.tail
    assert f"hello from pid {pid0}" in sink.texts(0)


def test_a_failing_sink_is_one_warning_and_the_thread_goes_on(ranks: Ranks, caplog: pytest.LogCaptureFixture) -> None:
    sink = Collected(fail=True)
    warner = Warner()
    t = tailer(ranks, sink, warner=warner)
    t.watch([RankProcess(0, ranks.start("ok"))])
    ranks.go_and_wait()
    end(t, failed=False)
    said = [r.getMessage() for r in caplog.records if "console lines were not sent" in r.getMessage()]
    assert len(said) == 1 and "ConnectionError: wandb is gone" in said[0]


def test_off_watches_nothing(ranks: Ranks) -> None:
    sink = Collected()
    t = tailer(ranks, sink, mode="off")
    t.watch([RankProcess(0, ranks.start("raise"))])
    ranks.go_and_wait()
    end(t, failed=True)
    assert sink.lines == []


def test_each_poll_reads_a_bounded_share_of_a_rank_s_backlog(tmp_path: Path) -> None:
    # The rank is this test's own process (alive for the whole test); its file holds 1 MiB of
    # lines before the tailer starts. At 1 MiB/s and a poll of 50 ms, a poll's share is one read
    # of 64 KiB: each handing to the sink is at most that many lines (and one open line's end).
    line = b"x" * 99 + b"\n"
    worker_file(tmp_path, os.getpid(), "out").write_bytes(line * ((1 << 20) // len(line)))
    worker_file(tmp_path, os.getpid(), "err").write_bytes(b"")
    batches: list[int] = []
    t = ConsoleTailer(
        plan_console("all", 1, 1), tmp_path, lambda lines: batches.append(len(lines)), poll_s=0.05, read_rate=1 << 20
    ).start()
    t.watch([RankProcess(0, os.getpid())])
    wait_until(lambda: sum(batches) >= (1 << 20) // len(line), WAIT_S, lambda: f"every line; got {sum(batches)}")
    assert t.finish(failed=False, timeout=WAIT_S)
    assert max(batches) <= (64 << 10) // len(line) + 1
    assert len(batches) >= (1 << 20) // (64 << 10)


def test_skips_are_said_at_most_every_30_s_with_their_bytes_summed() -> None:
    rank = RankConsole(0, RankBudget(live=100, tail=10))
    said = [(t, [x.text for x in rank.skipped(Stream.OUT, 1_000, now=t)]) for t in (0.0, 10.0, 20.0, 40.0, 50.0)]
    assert said == [
        (0.0, ["1,000 bytes of its stdout skipped: written faster than read"]),
        (10.0, []),
        (20.0, []),
        (40.0, ["3,000 bytes of its stdout skipped: written faster than read"]),
        (50.0, []),
    ]
    assert [x.text for x in rank.close(Stream.OUT, now=51.0)] == [
        "1,000 bytes of its stdout skipped: written faster than read"
    ]


def test_finishing_twice_returns_at_once(ranks: Ranks) -> None:
    t = tailer(ranks, Collected())
    assert t.finish(failed=False, timeout=WAIT_S)
    started = time.monotonic()
    assert t.finish(failed=False, timeout=WAIT_S)  # the thread is gone: nothing to wait for
    assert time.monotonic() - started < WAIT_S / 2
