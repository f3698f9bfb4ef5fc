"""What a Train run inside a Tune trial tells the trial's run through the hand-off (``_handoff``):
where its workers are and the attempt they arm in, how to watch them for hangs, its attempt's
state, and its failed attempts. Runs on the Train controller; every write is a GCS call, made in
order on a thread of its own, off the controller's event loop."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .. import _ray
from .._failure import FailedAttempt, FailureEvent
from .._fleet import HangSetting
from .._ray import Placement
from .._warn import Warner, describe
from . import handoff as _handoff


class TrialRelay:
    """What a Train run inside a Tune trial tells the trial's run (``WandbNodesTuneCallback`` owns
    it) through the hand-off (``_handoff``): where its workers are, how to watch them for hangs, and
    its attempt's state (the ranks that finished training, where it last checkpointed). Each write
    is a GCS call: made in order on a thread of its own, off the controller's event loop."""

    def __init__(self, trial_id: str, warner: Warner) -> None:
        self.trial_id = trial_id
        self._warner = warner
        self._watched = False  # hangs are watched (the attempt's state is written)
        self._attempt = _handoff.AttemptState()
        self._reports = 0  # this attempt's reports
        self._failures: list[FailureEvent] = []  # failed attempts and recoveries, in order
        self._writes: queue.SimpleQueue[tuple[Callable[[str, Any], None], Any, str, str]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def placed(self, placements: Sequence[Placement], attempt: str | None) -> None:
        """Where the workers are, and the key of the attempt they armed in; an attempt starts (its
        reports count from the checkpoint it restored)."""
        places = tuple(_handoff.WorkerPlace(p.node_id, p.hostname, p.rank) for p in placements)
        workers = _handoff.TrialWorkers(places, attempt)
        self._write(_handoff.publish_workers, workers, "relay", f"where trial {self.trial_id}'s workers are")
        self._reports = 0
        self._tell(checkpoint_reports=0)

    def hangs(self, mark: _handoff.TrialMark, options: Any, ctx: Any) -> str | None:
        """The run whose ranks are armed (the trial's), and the hang setting published for the
        trial's run to watch them; None when hangs are not watched."""
        hang = options.hang_timeout_s
        if not hang.enabled or not mark.run_id:
            return None
        setting = HangSetting(hang, options.on_hang, _ray.train_start(ctx).pg_timeout_s)
        self._write(_handoff.publish_hang, setting, "relay-hang", f"how to watch trial {self.trial_id} for hangs")
        self._watched = True
        return mark.run_id

    def finished(self, ranks: frozenset[int]) -> None:
        """The ranks whose train function returned, written as they change (Train polls every few seconds)."""
        self._tell(finished=ranks)

    def reported(self, checkpoint: bool) -> None:
        """A report of every rank; with a checkpoint, where a hang's place counts from."""
        self._reports += 1
        if checkpoint:
            self._tell(checkpoint_reports=self._reports)

    def attempt_failed(self, failed: FailedAttempt) -> None:
        """An attempt failed: named in the trial's run (its fleet asks the nodes and decides)."""
        self._failures.append(failed)
        self._write(_handoff.publish_failures, _handoff.TrialFailures(tuple(self._failures)), "relay-failure",
                    f"how trial {self.trial_id}'s attempt failed")  # fmt: skip

    def attempt_recovered(self, attempt: int) -> None:
        """``attempt`` reported after an earlier one failed."""
        self._failures.append(attempt)
        self._write(_handoff.publish_failures, _handoff.TrialFailures(tuple(self._failures)), "relay-failure",
                    f"that trial {self.trial_id} recovered")  # fmt: skip

    def _tell(self, **changes: Any) -> None:
        attempt = replace(self._attempt, **changes)
        if self._watched and attempt != self._attempt:
            self._attempt = attempt
            self._write(_handoff.publish_attempt, attempt, "relay-attempt", f"the state of trial {self.trial_id}")

    def _write(self, publish: Callable[[str, Any], None], value: Any, key: str, what: str) -> None:
        self._writes.put((publish, value, key, what))
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ray_wandb_nodes-trial-relay", daemon=True)
            self._thread.start()

    def _main(self) -> None:
        while True:
            publish, value, key, what = self._writes.get()
            try:
                publish(self.trial_id, value)
            except Exception as e:  # noqa: BLE001
                self._warner.warn(key, f"could not tell the Tune callback {what} ({describe(e)})")
