"""On the train workers: what the plugin sets up in each worker process before the train
function starts. Hang detection's side of a rank (``_hang``): armed as soon as the worker exists
(before Train sets up torch's process group, so the flight recorder's variable is read), then
its reports wrap in the beacon's report phase once the train context exists, the frameworks'
evaluation loops in its evaluating phase and the saves in its checkpointing phase (``_phases``:
the saves' patches are awaited from arming on, so that a module that imports ``save_file`` by
name during Ray's set-up gets the wrapped one). The frameworks' own W&B runs are quieted in the
same call (``_frameworks``). The rank's step anatomy (``steps``) is armed with it, in the beacon
slot's region kept for it, and each long phase the rank enters is left out of its figures. Apart
from hang detection, and whether it is on or not, a rank records its own failure in the attempt's
folder (``_failure.RankRecorder``: the train function's exception as it leaves the function, with
its traceback and innermost user frame), where its node's logger reads it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

from .. import _ray
from .._failure import RankRecorder, remember_positions
from .._hang import ArmedRank, Phase, arm_rank, armed_rank, hook_steps, in_phase, in_report, run_dir, train_starts
from .._ray.failures import hook_train_errors
from .._warn import describe
from . import frameworks as _frameworks
from . import phases as _phases
from . import steps as _steps

_arm_failure = ""  # why arming failed in this process ("" when it did not)
_recording: tuple[int, str] | None = None  # the (rank, attempt) whose failures this process records
_recorder: RankRecorder | None = None  # its recorder (the shutdown hook writes through it)
_stop_recorded = False  # its stop was recorded (once: the first sign of it)
_steps_failure = ""  # why the step anatomy is off on this armed rank ("" when it is not)


class WorkerSetup(NamedTuple):
    """What one train worker says of its set-up (the answer to :func:`setup`)."""

    rank: int
    hang: str  # "armed", "off", or why the rank is not armed
    steps: str = ""  # why its step anatomy is off on an armed rank ("": on, or not armed)
    failures: str = "off"  # "recorded", "off", or why the rank's own failure is not recorded


def record_failures(rank: int, attempt: str) -> str:
    """Record this process's failure as ``rank`` of the attempt ``attempt``, in its folder on this
    node: its mark now (the node's logger finds the process by it), and the train function's
    exception when it raises one (``_ray.failures.hook_train_errors``, on Ray's training thread).
    Once a process and attempt; ``"recorded"``, or why not (the worker goes on either way)."""
    global _recording, _recorder, _stop_recorded
    if _recording == (rank, attempt):
        return "recorded"
    try:
        folder = run_dir(attempt)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        recorder = RankRecorder(folder, rank)
        recorder.present()
        if not hook_train_errors(recorder.raised):
            return "not recorded: this Ray has no place to hook the train function's errors"
    except Exception as e:  # noqa: BLE001 - the run names the failure from Ray's account alone
        return f"not recorded: {describe(e)}"
    _recording, _recorder, _stop_recorded = (rank, attempt), recorder, False
    return "recorded"


def _stopped() -> None:
    """Ray Train stops this worker: say so, once, with where its training thread stands and its
    process groups' positions (a rank gone after this was stopped, not killed; a rank the others
    waited for shows where it stood). The first sign wins: the torch group's end, else the
    worker's shutdown call."""
    global _stop_recorded
    remember_positions()  # a raise after the group's end (a user's finally) still has them
    if _recorder is not None and not _stop_recorded:
        _stop_recorded = _recorder.stopped(_ray.training_thread_frames())


def arm(rank: int, attempt: str, hangs: bool = True) -> None:
    """Queued on a new worker ahead of Train's own calls: record its failures as ``rank`` of the
    attempt ``attempt`` (its folder's key, drawn by the callback for its worker group) and, with
    ``hangs``, arm it for hang detection. A failure to arm is kept for :func:`setup` to report;
    the worker goes on."""
    global _arm_failure
    record_failures(rank, attempt)
    if not hangs:
        return
    try:
        armed = arm_rank(attempt, rank)
        _phases.hook_saves()  # saves: the checkpointing phase (imports nothing)
        _arm_failure = ""
    except Exception as e:  # noqa: BLE001 - hang detection off on this rank, training goes on
        _arm_failure = describe(e)
        return
    arm_steps(armed)


def arm_steps(armed: ArmedRank) -> None:
    """The rank's step anatomy in its beacon slot's region (bytes 256-511), its hooks put in place
    as their modules are imported; each long phase the rank enters (a save, an evaluation, a
    preparation) leaves the step interval under way out of its figures. A failure is kept for
    :func:`setup` to report; hang detection and training go on."""
    global _steps_failure
    try:
        recorder = _steps.arm_steps(armed.beacon.extension, owner=armed.beacon)
        armed.on_long_phase = recorder.leave_out_interval
        _steps_failure = ""
    except Exception as e:  # noqa: BLE001 - no step anatomy on this rank, training goes on
        _steps_failure = describe(e)


class ReportHook:
    """Ray Train's report hooks on a rank (the shape of a ``TrainContextCallback``): a report is
    the report phase while inside Ray's barrier and a stamp when it returns; a checkpoint's
    transfer inside it (Ray 2.55 and later) is the checkpoint phase, allowed longer. The sync of
    the checkpoint's name, a barrier of every report, stays the report phase."""

    def on_report(self) -> contextlib.AbstractContextManager[None]:
        return in_report()

    @contextlib.contextmanager
    def on_checkpoint_sync(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def on_checkpoint_transfer(self) -> Iterator[None]:
        with in_phase(Phase.CHECKPOINTING):
            yield


def setup(rank: int, run_id: str | None, attempt: str | None, hangs: bool = True) -> WorkerSetup:
    """Once the worker's train context exists, before the train function: quiet the frameworks'
    own W&B runs, record the rank's failures in the attempt ``attempt``, and, with ``hangs``, hook
    this rank's reports, evaluation loops and saves to its beacon (armed by :func:`arm`, or now
    where that did not run: then the flight recorder may miss a process group already made)."""
    _frameworks.quiet_frameworks(rank, run_id)
    if not attempt:
        return WorkerSetup(rank, "off")
    failures = record_failures(rank, attempt)
    if failures == "recorded":
        try:
            _ray.hook_group_shutdown(_stopped)  # torch's process group, where Train made one
            if not _ray.add_shutdown_hook(_stopped):
                failures = "recorded, its stop not: this Ray has no worker shutdown hook"
        except Exception as e:  # noqa: BLE001 - the run judges its stop as before
            failures = f"recorded, its stop not: {describe(e)}"
    if not hangs:
        return WorkerSetup(rank, "off", failures=failures)
    if armed_rank() is None:
        arm(rank, attempt)
        if armed_rank() is None:
            return WorkerSetup(rank, f"not armed: {_arm_failure or 'unknown'}", failures=failures)
    hook_steps()  # torch is imported by now where Train set up its process group
    _phases.hook_evaluation()  # HF's and Lightning's evaluation loops: the evaluating phase
    _phases.hook_saves()  # the frameworks', torch's and safetensors' saves: the checkpointing phase
    train_starts()
    try:
        hooked = _ray.add_report_hook(ReportHook())
    except Exception as e:  # noqa: BLE001
        return WorkerSetup(rank, f"armed, reports not seen: {describe(e)}", _steps_failure, failures)
    said = "armed" if hooked else "armed, reports not seen: this Ray has no report hook"
    return WorkerSetup(rank, said, _steps_failure, failures)
