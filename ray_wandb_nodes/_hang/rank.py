"""A rank's side of hang detection, as a train worker runs it: arming (the beacon, torch's
optimizer-step hook, faulthandler and the dump thread) in its attempt's folder on this node.

The folder is named by the attempt's key, which the driver side draws for each worker group and
hands both to the ranks (``arm_rank``) and to the node loggers that read them (``folders``): two
jobs of one run name, or two attempts of one job, never share one. Arming is done once a
process, before the train function starts (and before torch's process group exists, so that
the flight recorder's variable is in the environment when it is read).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .beacon import LONG_PHASES, Beacon, Phase, install_step_hook
from .evidence import Armed, arm, disarm
from .flight import flight_recorder_env
from .folders import run_dir
from .policy import auto_running_limit_s

FLIGHT_BUFFER = 2000  # entries a process group: a few minutes of steps of a large model


@dataclass
class ArmedRank:
    """What :func:`arm_rank` set up in this process, for :func:`disarm_rank`."""

    rank: int
    beacon: Beacon
    armed: Armed
    remove_hook: Callable[[], None] | None
    # Called as the rank enters a long phase (a save, an evaluation, a preparation): another
    # subsystem's (the step anatomy leaves the step interval under way out of its figures).
    on_long_phase: Callable[[], None] | None = None


_current: ArmedRank | None = None


def arm_rank(key: str, rank: int, root: Path | None = None) -> ArmedRank:
    """Arm this process as ``rank`` of the attempt ``key`` (its folder: ``folders.attempt_key``;
    idempotent: a second call returns the first).

    Sets the flight recorder's variable unless the user set it, creates the beacon and arms the
    evidence dumps. Optimizer steps are hooked by :func:`hook_steps` once torch is imported (this
    never imports it: a job without torch, XGBoost's or JAX's, pays nothing and loads nothing)."""
    global _current
    directory = run_dir(key, root)
    if _current is not None and _current.rank == rank and _current.beacon.directory == directory:
        return _current
    if _current is not None:
        disarm_rank()
    os.environ.update(flight_recorder_env(FLIGHT_BUFFER, environ=os.environ))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Not judged until its train function starts; an interval past "auto"'s running limit was a hang
    # and stays out of the cadence (under a fixed limit the cadence is not used).
    beacon = Beacon(directory, rank, Phase.STARTING, hang_limit_s=auto_running_limit_s)
    armed = arm(directory, rank, beacon)
    _current = ArmedRank(rank, beacon, armed, None)
    hook_steps()
    return _current


def train_starts() -> None:
    """Right before the train function: the rank is judged from now on (see ``Phase.STARTING``)."""
    armed = _current
    if armed is not None and armed.beacon.current_phase is Phase.STARTING:
        armed.beacon.start_clock()


def hook_steps() -> bool:
    """Stamp the beacon on every optimizer step of this process (torch's global hook), once
    torch is imported here; whether steps are hooked now."""
    armed = _current
    if armed is None:
        return False
    if armed.remove_hook is None and "torch" in sys.modules:
        armed.remove_hook = install_step_hook(armed.beacon)
    return armed.remove_hook is not None


def disarm_rank() -> None:
    """Undo :func:`arm_rank` (the worker's shutdown): no hook, no dump thread, no slot left."""
    global _current
    current, _current = _current, None
    if current is None:
        return
    if current.remove_hook is not None:
        with contextlib.suppress(Exception):
            current.remove_hook()
    disarm(current.armed, current.beacon)
    current.beacon.close()


def armed_rank() -> ArmedRank | None:
    return _current


@contextlib.contextmanager
def in_report() -> Iterator[None]:
    """Around ``ray.train.report`` on a rank: the report phase while inside (Ray's barrier), and
    a report stamped once it returns; a long phase it was called in (an evaluation) is taken up
    again after it. Nothing where the process is not armed."""
    armed = _current
    if armed is None:
        yield
        return
    before = armed.beacon.current_phase
    armed.beacon.phase(Phase.IN_REPORT)
    try:
        yield
    finally:
        armed.beacon.phase(before if before in LONG_PHASES else Phase.RUNNING)
        armed.beacon.report()
        if armed.remove_hook is None:
            hook_steps()  # torch imported by the train function since


@contextlib.contextmanager
def in_phase(phase: Phase) -> Iterator[None]:
    """A long phase (checkpointing, evaluating) on a rank, allowed longer than a step; the phase
    it interrupted (a report, say) is taken up again after it, however the block ends. Nothing
    where the process is not armed."""
    armed = _current
    if armed is None:
        yield
        return
    before = armed.beacon.current_phase
    armed.beacon.phase(phase)
    if phase in LONG_PHASES:
        _long_phase_entered(armed)
    try:
        yield
    finally:
        armed.beacon.phase(before)


_NOT_FOR_SAVES = LONG_PHASES | {Phase.STARTING}


def enter_phase(phase: Phase) -> tuple[Beacon, Phase] | None:
    """For a wrapper around a framework's save (called often, on any thread): enter ``phase`` on
    an armed rank's training thread where the rank is running or in a report, and return what
    :func:`leave_phase` needs; None, having done nothing, anywhere else: no rank armed, another
    thread (an asynchronous save beside training: the rank's steps go on), a rank already in a
    long phase (a ``torch.save`` inside a framework's save, or inside an evaluation: the outer
    phase stays) or not started. Never raises."""
    armed = _current
    if armed is None:
        return None
    try:
        beacon = armed.beacon
        before = beacon.current_phase
        if before in _NOT_FOR_SAVES or not beacon.on_training_thread():
            return None
        beacon.phase(phase)
        if phase in LONG_PHASES:
            _long_phase_entered(armed)
    except Exception:  # noqa: BLE001 - a beacon closed under us: the save goes on, unwatched
        return None
    return beacon, before


def _long_phase_entered(armed: ArmedRank) -> None:
    """Tell the rank's other subsystem that a long phase began (never raises into the phase)."""
    listener = armed.on_long_phase
    if listener is not None:
        with contextlib.suppress(Exception):
            listener()


def leave_phase(entered: tuple[Beacon, Phase]) -> None:
    """Hand back the phase :func:`enter_phase` interrupted. Never raises."""
    beacon, before = entered
    try:
        beacon.phase(before)
    except Exception:  # noqa: BLE001 - a beacon closed under us: the save's outcome stands
        pass
