"""What the Train callback's hooks do on the controller: start the run its writes go to (its own
``TrainRun``, or inside a Tune trial that logs, the trial's run through the ``TrialRelay``), tell it
where the ranks run and when their attempts start, fail and end, hand it the reports, and end it.

``WandbNodesCallback`` keeps only the translation of Ray's hooks into these calls (and that no
exception leaves a hook); this class holds their order and state, testable without a Train
controller.
"""

from __future__ import annotations

import socket
from typing import Any

from .. import _ray
from .._config.options import Options
from .._config.secrets import CapturedEnv
from .._ray.failures import max_failures
from .._warn import Warner
from . import handoff as _handoff
from .train_failures import AttemptFailures
from .train_run import TrainRun
from .train_workers import TrainWorkers
from .trial_relay import TrialRelay


class TrainController:
    """The Train controller's side of one W&B run, driven by the callback's hooks (on Ray's event loop)."""

    def __init__(self, options: Options, env: CapturedEnv, warner: Warner, driver_cwd: str) -> None:
        self.options, self._env, self._warner, self._driver_cwd = options, env, warner, driver_cwd
        self.run: TrainRun | None = None
        # Built inside a Tune trial: maybe that trial's W&B run is the run (see _handoff).
        self.tune_trial_id = _ray.current_trial_id() if options.mode.logs else None
        self.relay: TrialRelay | None = None  # inside a trial whose run is the run (see _handoff)
        self.workers = TrainWorkers(warner)  # where the ranks run, and the attempt they arm in
        self.failures = AttemptFailures()  # the current attempt's failure, as Train's hooks show it

    def __getstate__(self) -> dict[str, Any]:  # runtime state never travels
        return {**self.__dict__, "run": None, "relay": None}

    @property
    def writing(self) -> bool:
        """Whether the hooks have a run to tell (its own, or a trial's through the relay)."""
        return self.run is not None or self.relay is not None

    @property
    def run_id(self) -> str | None:
        """The W&B run id (the group's base id for the node and all strategies), once started."""
        return self.run.base_id if self.run else None

    # the controller ------------------------------------------------------------------------------
    def start(self, train_run_context: Any) -> None:
        if not self.options.mode.logs or self.writing:
            return
        mark = _handoff.trial_mark(self.tune_trial_id) if self.tune_trial_id else None
        if self.tune_trial_id and mark:
            # Inside a trial that WandbNodesTuneCallback logs: the trial's run is the run;
            # this callback only tells it where the train workers are, and how to watch them.
            self.relay = TrialRelay(self.tune_trial_id, self._warner)
            hangs = self.relay.hangs(mark, self.options, train_run_context) is not None
            self.workers.watch(mark.run_id or None, hangs)
            self.failures = AttemptFailures(max_failures(train_run_context), sink=self.relay)
            return
        import ray

        self.run = TrainRun(
            self.options,
            self._env,
            self._warner,
            start=_ray.train_start(train_run_context),
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            driver_cwd=self._driver_cwd,
        )
        self.workers.watch(self.run.watch_run, hangs=self.run.hang_run is not None)
        self.failures = AttemptFailures(max_failures(train_run_context), sink=self.run)

    def finish(self, result: Any) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if _ray.result_failed(result) else 0, timeout=self.options.finish_timeout_s)

    def abort(self) -> None:
        # The controller exits right after an abort: finish fast, as failed.
        if self.run is not None:
            self.run.abort()

    def failure_decided(self, failure_decision: Any) -> None:
        self.failures.decided(failure_decision, self.workers.placements.values(), self.workers.attempt)

    # the worker groups ---------------------------------------------------------------------------
    def group_starts(self) -> None:
        self.workers.new_group()
        self.failures.new_group()

    def workers_known(self, workers: list[Any]) -> None:
        self.workers.arm(workers)  # ahead of Train's own calls there, the process group's included
        if self.writing:
            # every rank of a worker group, or (2.56+) the ranks of a replaced replica group
            self.workers.placements.update((p.rank, p) for p in _ray.placements_of(workers))
            self._placed()

    def group_started(self, worker_group: Any) -> None:
        if self.writing:
            placements = {p.rank: p for p in _ray.worker_placements(worker_group)}
            if placements != self.workers.placements:  # workers_known told the fleet already
                self.workers.placements = placements
                self._placed()
        if self.run is not None:
            # Right before Ray launches the train function: hold it (bounded) until every node writer
            # has joined and sampled, so the set-up inside the function is seen on every node.
            self.run.await_writers()
        if self.writing:  # last: a rank's hang clock starts with its train function
            self.workers.setup(worker_group, self._setup_run_id())

    def group_ends(self) -> None:
        if self.run is not None:
            self.run.attempt_ended(self.failures.failed)

    def replica_group_started(self, replica_group: Any) -> None:
        if self.writing:
            self.failures.replaced()  # the failed replica's ranks ended with their processes (their console too)
            self.workers.placements.update((p.rank, p) for p in _ray.worker_placements(replica_group))
            self._placed()
            self.workers.setup(replica_group, self._setup_run_id())

    def polled(self, worker_group_status: Any) -> None:
        self.failures.polled(worker_group_status, self.workers.group)  # the first failing poll: the attempt failed
        if self.workers.hang_run and self.run is not None:
            self.run.ranks_finished(_ray.finished_ranks(worker_group_status))
        elif self.workers.hang_run and self.relay is not None:
            self.relay.finished(_ray.finished_ranks(worker_group_status))

    def reported(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self.failures.reported()  # after a retry, its first report: the attempt recovered
        if self.run is not None and metrics:
            self.run.report(metrics, _ray.report_checkpoint(training_report))
        elif self.relay is not None:
            self.relay.reported(_ray.report_checkpoint(training_report) is not None)

    def _setup_run_id(self) -> str | None:
        """The run a worker's set-up names (its frameworks' runs quieted for it)."""
        return self.run_id or (self.relay.trial_id if self.relay is not None else None)

    def _placed(self) -> None:
        w = self.workers
        placements = [w.placements[rank] for rank in sorted(w.placements)]
        if self.relay is not None:
            self.relay.placed(placements, w.attempt)
            return
        assert self.run is not None
        self.run.workers_placed(placements, attempt=w.attempt)
