"""When a node signals a rank for faulthandler's dump (``_hang/dumps.py``): only where the rank's
Python provably cannot run (its dump thread keeps waking for a GIL no thread hands over) and it
still catches the signal, read in ``/proc`` right before. Real processes armed as ranks are
(``tests/support/armed_process.py``): one holding the GIL in C is signalled and its stacks come
back; one stopped (as a throttled pod's is, slow to be scheduled) and one that unregistered its
handler are not, and answer once they run."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ray_wandb_nodes._hang.beacon import BeaconSlot
from ray_wandb_nodes._hang.dumps import request_dumps
from ray_wandb_nodes._hang.evidence import EvidencePaths
from ray_wandb_nodes._hang.stacks import training_thread
from tests.support.armed_process import running
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[3]
WITHDRAWN = "its dump thread did not take the request in time (Python could not run)"


def answered(slot: BeaconSlot) -> bool:
    """Whether the rank's dump thread answered a request (the one left in its FIFO)."""
    return EvidencePaths.of(slot.path.parent, slot.rank, slot.pid).python.exists()


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state ``T`` in ``/proc``)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        states.append(stat[stat.rindex(")") + 2])
    return all(state == "T" for state in states)


def test_a_rank_holding_the_gil_in_c_is_signalled_and_its_faulthandler_stacks_come_back(
    tmp_path: Path, gil_lib: str
) -> None:
    with running(tmp_path, "gil", gil_lib) as (proc, slot, _):
        [evidence] = request_dumps([slot], timeout_s=5, grace_s=0.3)
        assert evidence.python == () and evidence.notes == (WITHDRAWN,)
        train = training_thread(evidence.native, slot.thread_ident)
        assert train is not None and train.frames[0].function == "hold_gil_in_c", evidence.native
        assert proc.poll() is None


def test_a_stopped_rank_is_not_signalled_and_answers_once_it_runs(tmp_path: Path) -> None:
    """Stopped past the grace, as a throttled pod's process is descheduled: its request stays
    unread, which once sent the signal. Signalled now, it would run faulthandler's walk the
    moment it resumes, while its threads run Python."""
    with running(tmp_path, "python") as (proc, slot, _):
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # The kill returns before every thread has stopped (each stops on its way back to user
            # space): a dump thread still running could take the request.
            wait_until(lambda: stopped(proc.pid), 20, "every thread of the rank stopped")
            [evidence] = request_dumps([slot], timeout_s=1.5, grace_s=0.3)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert evidence.python == () and evidence.native == ()
        assert "not signalled: the process is stopped (SIGSTOP, or a debugger)" in evidence.notes
        assert EvidencePaths.of(tmp_path, 0, proc.pid).stacks.stat().st_size == 0  # no signal reached it
        wait_until(lambda: answered(slot), 20, "the dump thread's answer to the request left in its FIFO")
        assert proc.poll() is None


def test_a_rank_that_unregistered_its_handler_is_not_signalled(tmp_path: Path, gil_lib: str) -> None:
    """Its slot still records the signal, and its Python cannot run: only ``SigCgt``, read right
    before the signal, says that the signal would now end it."""
    with running(tmp_path, "unregistered", gil_lib) as (proc, slot, release):
        [evidence] = request_dumps([slot], timeout_s=2, grace_s=0.3)
        assert evidence.python == () and evidence.native == ()
        assert f"not signalled: signal {slot.dump_signal} is no longer caught in the process (SigCgt)" in evidence.notes
        assert WITHDRAWN not in evidence.notes  # the request was put back
        assert proc.poll() is None
        release.touch()
        wait_until(lambda: answered(slot), 20, "the dump thread's answer once the GIL is free")


def test_a_rank_running_python_answers_and_is_never_signalled(tmp_path: Path) -> None:
    with running(tmp_path, "python") as (proc, slot, _):
        [evidence] = request_dumps([slot], timeout_s=5, grace_s=0.3)
        assert evidence.python and evidence.native == () and evidence.notes == ()
        assert proc.poll() is None
