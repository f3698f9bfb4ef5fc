"""What /proc says of a rank's process, read on this test's own process (Linux)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ray_wandb_nodes._hang.proc import signal_caught, thread_stopped, thread_wakes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")


def test_a_threads_wakes_count_its_sleeps() -> None:
    pid, tid = os.getpid(), threading.get_native_id()
    before = thread_wakes(pid, tid)
    assert before is not None
    for _ in range(3):
        time.sleep(0.001)  # each sleep is a voluntary switch of this thread
    after = thread_wakes(pid, tid)
    assert after is not None and after >= before + 3
    assert not thread_stopped(pid, tid)


def test_a_signal_is_caught_while_a_handler_is_installed() -> None:
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert signal_caught(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        assert not signal_caught(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_what_cannot_be_read_is_unknown() -> None:
    gone = 2**22 + 1  # above Linux's pid_max default of 4194304: never a process
    assert thread_wakes(gone, gone) is None
    assert not thread_stopped(gone, gone)
    assert not signal_caught(gone, signal.SIGUSR2)
    assert not signal_caught(os.getpid(), 0)
