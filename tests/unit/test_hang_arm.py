"""Arming a rank and asking it for evidence, in this process: the signal chosen, the slot that
records it, both dumps taken through the real signal and FIFO, and no signal to a process that
did not register one (SIGUSR2's default action would end it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_wandb_nodes._hang.beacon import Beacon, read_slots
from ray_wandb_nodes._hang.evidence import DUMP_THREAD_NAME, EvidencePaths, arm, disarm, free_signal, request_dump

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def default_user_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    for s in saved:
        signal.signal(s, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_free_signal_prefers_sigusr2_and_skips_taken_ones(default_user_signals: None) -> None:
    assert free_signal() == signal.SIGUSR2
    signal.signal(signal.SIGUSR2, lambda *_: None)
    assert free_signal() == signal.SIGUSR1
    signal.signal(signal.SIGUSR1, lambda *_: None)
    assert free_signal() == 0


def test_an_armed_rank_gives_its_python_dump_first_and_faulthandlers_only_when_that_fails(
    tmp_path: Path, default_user_signals: None
) -> None:
    beacon = Beacon(tmp_path, 4)
    armed = arm(tmp_path, 4, beacon)
    try:
        assert armed.signum == signal.SIGUSR2 and arm(tmp_path, 4, beacon) is armed
        [slot] = read_slots(tmp_path)
        assert slot.dump_signal == signal.SIGUSR2
        evidence = request_dump(slot, timeout_s=10)
        assert evidence.notes == ()
        me = threading.get_ident()
        # Python runs here: the dump thread answers, and the process is never signalled (a
        # faulthandler walk while another thread runs Python can crash the process).
        assert evidence.native == ()
        assert {t.name for t in evidence.python} >= {threading.current_thread().name}
        assert DUMP_THREAD_NAME not in {t.name for t in evidence.python}
        mine = next(t for t in evidence.python if t.ident == me)
        assert any(f.function == "request_dumps" for f in mine.frames)
        # This thread made the beacon, so it is the "training" thread and comes first.
        assert evidence.training_ident == me and evidence.threads()[0].ident == me
        # A second request is answered afresh (its own id), not from the first one's files.
        again = request_dump(slot, timeout_s=10)
        assert again.python and not again.native
        # No dump thread to answer: faulthandler's dump, every thread, this one included.
        hidden = armed.paths.request.rename(tmp_path / "hidden.req")
        native = request_dump(slot, timeout_s=10)
        hidden.rename(armed.paths.request)  # back, for disarm to wake the dump thread
        assert native.notes == ("no dump thread (not armed)",) and native.python == ()
        assert me in {t.ident for t in native.native}
        assert all(t.name is None for t in native.native)  # faulthandler (3.11) names no thread
    finally:
        disarm(armed, beacon)
        beacon.close()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL and not armed.paths.request.exists()
    assert armed.thread is not None and not armed.thread.is_alive()


def test_each_process_of_a_rank_has_its_own_files(tmp_path: Path) -> None:
    first, second = EvidencePaths.of(tmp_path, 3, 100), EvidencePaths.of(tmp_path, 3, 101)
    assert first.stacks == tmp_path / "rank-3.100.stacks" and first.request == tmp_path / "rank-3.100.req"
    assert first.python == tmp_path / "rank-3.100.evidence.json"
    assert {first.stacks, first.request, first.python}.isdisjoint({second.stacks, second.request, second.python})


def test_a_process_that_did_not_register_is_not_signalled(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom ray_wandb_nodes._hang.beacon import Beacon\n"
        f"b = Beacon({str(tmp_path)!r}, 0)\nprint('ready', flush=True)\nsys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        [slot] = read_slots(tmp_path)
        evidence = request_dump(slot, timeout_s=0.5)
        assert evidence.native == () and evidence.python == ()
        assert set(evidence.notes) == {"no dump thread (not armed)", "faulthandler not registered: not signalled"}
        assert proc.poll() is None  # still alive: no SIGUSR2 reached it
    finally:
        proc.kill()
        proc.wait()
