"""Arming a rank and asking it for evidence, in this process: the signal chosen, the slot that
records it, the dump thread's answer through the real FIFO, and no signal to a process whose
Python runs or that did not register one (SIGUSR2's default action would end it); the signal
itself, to real processes: ``test_signal.py``."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_wandb_nodes._hang.beacon import Beacon, BeaconSlot, read_slots
from ray_wandb_nodes._hang.dumps import request_dump, request_dumps
from ray_wandb_nodes._hang.evidence import DUMP_THREAD_NAME, Armed, EvidencePaths, arm, disarm, free_signal
from tests.support.child import python_child
from tests.support.wait import wait_until


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
    beacon.step()  # this thread's progress: it is the "training" thread
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
        # This thread stamped the beacon last, so it is the "training" thread and comes first.
        assert evidence.training_ident == me and evidence.threads()[0].ident == me
        # A second request is answered afresh (its own id), not from the first one's files.
        again = request_dump(slot, timeout_s=10)
        assert again.python and not again.native
        # No dump thread to answer: nothing shows that its Python cannot run (it can: this
        # process runs it), so no signal either, and no dump.
        hidden = armed.paths.request.rename(tmp_path / "hidden.req")
        none = request_dump(slot, timeout_s=1)
        hidden.rename(armed.paths.request)  # back, for disarm to wake the dump thread
        assert none.notes == (
            "no dump thread (not armed)",
            "not signalled: no dump thread to show that its Python cannot run",
        )
        assert none.python == () and none.native == () and armed.paths.stacks.stat().st_size == 0
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
    with python_child(code) as proc:
        [slot] = read_slots(tmp_path)
        evidence = request_dump(slot, timeout_s=0.5)
        assert evidence.native == () and evidence.python == ()
        assert set(evidence.notes) == {"no dump thread (not armed)", "not signalled: faulthandler not registered"}
        assert proc.poll() is None  # still alive: no SIGUSR2 reached it


@contextlib.contextmanager
def armed_rank(folder: Path, rank: int) -> Iterator[tuple[Armed, BeaconSlot]]:
    """A rank of this process armed in ``folder`` (beacon, faulthandler, dump thread), its slot as the
    node reads it; disarmed after."""
    beacon = Beacon(folder, rank)
    armed = arm(folder, rank, beacon)
    try:
        [slot] = read_slots(folder)
        yield armed, slot
    finally:
        disarm(armed, beacon)
        beacon.close()


def test_a_dump_thread_that_took_its_request_is_waited_for_and_never_signalled(
    tmp_path: Path, default_user_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python runs in that process (its dump thread is writing): faulthandler's walk of its frames
    meanwhile could crash it, so the slow answer is waited for past the first round's grace."""
    from ray_wandb_nodes._hang import evidence as module

    answer = module._write_python_evidence
    writing = threading.Event()

    def slow_answer(path: Path, request_id: int) -> None:
        writing.set()
        threading.Event().wait(1.0)  # a loaded node: longer than the grace below
        answer(path, request_id)

    monkeypatch.setattr(module, "_write_python_evidence", slow_answer)
    with armed_rank(tmp_path, 5) as (armed, slot):
        [evidence] = request_dumps([slot], timeout_s=10, grace_s=0.2)
        assert writing.is_set() and evidence.python and evidence.notes == ()
        assert evidence.native == () and armed.paths.stacks.stat().st_size == 0  # no signal reached it


def test_a_dump_thread_slow_to_be_scheduled_is_not_signalled_and_answers_its_request_later(
    tmp_path: Path, default_user_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dump thread not yet woken past the whole wait (a throttled or busy node): that is no
    proof that the process's Python cannot run (this one runs it), so it is not signalled; its
    request stays in its FIFO and is answered once the thread runs."""
    from ray_wandb_nodes._hang import evidence as module

    release = threading.Event()
    real_select = module.select.select
    woken = []

    def late_select(*args: object) -> object:
        if woken:  # the dump thread's second wait onwards: as it is
            return real_select(*args)  # type: ignore[arg-type]
        woken.append(True)
        release.wait(10)  # the dump thread's first wake comes only when the test says
        return real_select(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(module.select, "select", late_select)
    with armed_rank(tmp_path, 6) as (armed, slot):
        [evidence] = request_dumps([slot], timeout_s=1.0, grace_s=0.2)
        assert evidence.python == () and evidence.native == () and armed.paths.stacks.stat().st_size == 0
        # Not signalled: its dump thread did not keep waking for a GIL nobody hands over (how often
        # it woke while the test held it depends on the scheduler, and is no part of the claim).
        woke = re.compile(r"not signalled: its dump thread woke \d+ times waiting for the GIL")
        assert any(woke.match(n) for n in evidence.notes), evidence.notes
        release.set()
        wait_until(armed.paths.python.exists, 10, "the answer to the request left in the FIFO")
        assert request_dump(slot, timeout_s=10).python  # and the next one is answered, as usual


def test_the_stacks_come_first_and_a_slow_flight_recorder_dump_does_not_hold_them(
    tmp_path: Path, default_user_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray_wandb_nodes._hang import evidence as module

    release = threading.Event()

    def slow_recorder() -> str:
        release.wait(10)  # a full recorder on a loaded node: past the node's wait
        return '{"pg_status": {}, "entries": []}'

    monkeypatch.setattr(module, "dump_flight_recorder", slow_recorder)
    with armed_rank(tmp_path, 7) as (_, slot):
        # 2 s: the stacks are a wake of the dump thread and a walk of this process's frames
        # (milliseconds), with a loaded machine's scheduling room; the recorder is held past it.
        [evidence] = request_dumps([slot], timeout_s=2.0, grace_s=0.3)
        assert threading.current_thread().name in {t.name for t in evidence.python}
        assert evidence.flight is None and evidence.native == ()
        assert evidence.notes == ("the flight recorder's dump did not come within the wait",)
        release.set()
        [complete] = request_dumps([slot], timeout_s=10)
        assert complete.notes == () and complete.flight is not None
