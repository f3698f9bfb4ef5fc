"""The Train callback's dealings with its train workers, on the controller: where each rank runs,
the attempt whose folder their ranks record their failures in (and arm in for hangs), and the
set-up each worker runs before its train function.

An attempt is one worker group: its ranks record (and arm) in a folder of their own on each node, named by a
key drawn here (``_hang.attempt_key``: the run id, the group's number in this job, and a token
drawn once a job). Two jobs of one run name and storage path, or two worker groups of one job (a
restart), never share a folder; a replaced replica group (Ray 2.56+) joins its group's attempt.
The key reaches the ranks (their arming), the fleet (the run's placement) and through it the node
loggers that watch the folder, and, for a Train run inside a Tune trial, the trial's run.
"""

from __future__ import annotations

from typing import Any

from .. import _ray
from .._hang import attempt_key, new_token
from .._ray import Placement
from .._warn import Warner
from .._worker import setup as _worker_setup

SETUP_TIMEOUT_S = 10.0  # for every train worker to patch its wandb.init and hook its reports (see setup)


class TrainWorkers:
    """The workers of one Train run, as the callback's hooks learn them (on the controller's loop)."""

    def __init__(self, warner: Warner) -> None:
        self._warner = warner
        self.placements: dict[int, Placement] = {}  # rank -> where it runs now
        # The run whose ranks are watched: their failures recorded in the attempt's folder (and, with
        # ``hangs``, their beacons stamped there); None: not watched.
        self.watched_run: str | None = None
        self.hangs = False
        self._token = new_token()  # this job's (each copy of the callback a controller gets draws its own)
        self._groups = 0  # worker groups started so far
        self.attempt: str | None = None  # the key the current worker group's ranks arm in
        self.group: Any = None  # the current worker group (its pending polls: ``_ray.failures.poll_of``)

    def __getstate__(self) -> dict[str, Any]:  # runtime state never travels; a copy is another job
        return {"_warner": self._warner, "placements": {}, "watched_run": None, "hangs": False, "_token": new_token(),
                "_groups": 0, "attempt": None, "group": None}  # fmt: skip

    def watch(self, run_id: str | None, hangs: bool) -> None:
        """Watch the ranks for ``run_id`` (None: not at all); with ``hangs``, arm them for hangs too."""
        self.watched_run, self.hangs = run_id, hangs and run_id is not None

    @property
    def hang_run(self) -> str | None:
        """The run whose ranks are armed for hangs; None: not armed."""
        return self.watched_run if self.hangs else None

    def new_group(self) -> None:
        """A worker group starts (a first start, or a restart): its ranks arm in a new attempt."""
        self.attempt = None

    def current(self) -> str | None:
        """The key the current worker group's ranks arm in (drawn at its first use); None: not watched."""
        if self.watched_run is not None and self.attempt is None:
            self._groups += 1
            self.attempt = attempt_key(self.watched_run, self._groups, self._token)
        return self.attempt

    def arm(self, workers: list[Any]) -> None:
        """Queue the arming of ``workers`` (a worker group's, or a replaced replica group's) ahead of
        Train's own calls there, the process group's included, in the current attempt."""
        attempt = self.current()
        if attempt is not None:
            _ray.queue_on_workers(workers, _worker_setup.arm, attempt, self.hangs)

    def setup(self, worker_group: Any, run_id: str | None) -> None:
        """One history writer per run: a framework's own ``wandb.init`` on a train worker (HF
        ``report_to="wandb"``, Lightning's ``WandbLogger``) gets a disabled run (see _frameworks);
        each rank records its failure, and its reports stamp its hang beacon (see _worker_setup)."""
        self.group = worker_group
        attempt = self.current()
        answers = _ray.run_on_workers(
            worker_group, _worker_setup.setup, run_id, attempt, self.hangs, timeout=SETUP_TIMEOUT_S
        )
        if answers is None:
            self._warner.warn(
                "frameworks", "the train workers did not answer in time: a framework's own W&B logging stays on there"
            )
            return
        unrecorded = [a for a in answers if a.failures not in ("recorded", "off")]
        if unrecorded:
            self._warner.warn(
                f"failure-record:{unrecorded[0].failures}",
                f"a failure of rank(s) {', '.join(str(a.rank) for a in unrecorded)} is named from Ray's account "
                f"alone: {unrecorded[0].failures}",
            )
        unarmed = [a for a in answers if a.hang not in ("armed", "off")]
        if unarmed:
            self._warner.warn(
                f"hang-arm:{unarmed[0].hang}",
                f"hang detection sees less of rank(s) {', '.join(str(a.rank) for a in unarmed)}: {unarmed[0].hang}",
            )
        unmeasured = [a for a in answers if a.steps]
        if unmeasured:
            self._warner.warn(
                f"steps-arm:{unmeasured[0].steps}",
                f"slow ranks are not judged: the step anatomy is off on rank(s) "
                f"{', '.join(str(a.rank) for a in unmeasured)} ({unmeasured[0].steps})",
            )
