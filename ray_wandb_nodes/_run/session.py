"""One W&B run's lifecycle: start, nodes used, report, checkpoint, finish; one shape for every strategy.

The Ray adapters (``train.py``, ``tune.py``) translate hooks into these calls on a session:

- :class:`SharedSession` (strategies shared and main, and every Tune trial): the run's primary
  writer on the driver side creates the run; the fleet's node writers join it once it exists
  and, at the end, finish before the primary sends the final state.
- :class:`StandaloneSession` (strategies node and all): the run is one writer inside its node's
  logger; the fleet routes the run's rows and checkpoints there and finishes it.

Whoever owns a writer finishes it: the session its primary, the fleet its node writers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from typing import Any

from .._fleet import NodeFleet, SharedTarget, StandaloneTarget
from .._gpu_ids import RankGpus
from .._wandb.artifacts import checkpoint_artifact
from .primary import PrimaryWriter

# Past the bounds the fleet keeps itself: how much longer a waiting finish waits for it.
FLEET_SLACK_S = 5.0
# How long the end waits for a primary still creating its run (W&B unreachable): about none.
UNCREATED_WAIT_S = 1.0


class RunSession:
    """What both kinds share: the run id, the fleet, and a finish that happens once."""

    def __init__(self, fleet: NodeFleet, finish_timeout_s: float) -> None:
        self.fleet = fleet
        self.finish_timeout_s = finish_timeout_s
        self._finishing = False
        self._writers_done: threading.Event | None = None
        self._waited = False
        self._exit_code = 1
        self._timeout = finish_timeout_s
        self._first = True  # the ranks' next report is their first: a worker group's set-up is over

    @property
    def run_id(self) -> str:
        raise NotImplementedError

    @property
    def finishing(self) -> bool:
        return self._finishing

    @property
    def retired(self) -> threading.Event | None:
        """Set once the fleet has ended the run (its node writers, then its ``then``); None before
        :meth:`finish`."""
        return self._writers_done

    def start(self) -> None:
        raise NotImplementedError

    def set_nodes(
        self,
        nodes: Iterable[str],
        covered_node: str | None = None,
        ranks: dict[str, tuple[int, ...]] | None = None,
        rank_gpus: dict[int, RankGpus] | None = None,
        attempt: str | None = None,
        pids: dict[int, int] | None = None,
    ) -> None:
        """The nodes the run uses now (replacing the previous set), less ``covered_node``, the
        train ranks on each node and each rank's GPU ids (for the tables and the health rules),
        the key of their attempt (their folder of beacons and dumps on each node) and each rank's
        process id (its console)."""
        self._first = True  # a new worker group
        self.fleet.set_run_nodes(
            self.run_id, nodes, covered_node, ranks=ranks, rank_gpus=rank_gpus, attempt=attempt, pids=pids
        )

    def attempt_ended(self, failed: bool) -> None:
        """The ranks' attempt ended (their worker group shuts down), ``failed`` or not."""
        self.fleet.attempt_ended(self.run_id, failed)

    def update_config(self, config: dict[str, Any]) -> None:
        """Run config learnt after the start (a standalone run's is set when its writer starts)."""

    def report(self, metrics: Any) -> None:
        raise NotImplementedError

    def report_ranks(self, metrics: list[dict[str, Any]], checkpoint: bool = False) -> None:
        """Every rank's report, for the straggler rule by metric and the idle-GPU rule (a run with
        a node table); ``checkpoint``: the report carried one."""

    def log_checkpoint(self, checkpoint: Any, name: str, aliases: list[str]) -> None:
        raise NotImplementedError

    def finish(self, exit_code: int, timeout: float | None = None) -> None:
        """Start ending the run with ``exit_code`` (node writers first, each bound ``timeout``);
        returns at once, and only the first call counts."""
        if self._finishing:
            return
        self._finishing = True
        self._exit_code = exit_code
        self._timeout = self.finish_timeout_s if timeout is None else timeout
        self._writers_done = self._retire(exit_code, self._timeout)

    def wait_finished(self, deadline: float | None = None, end: float | None = None) -> None:
        """Return once the run is finished, or its bounds have passed (after :meth:`finish`; only
        the first call waits). ``deadline`` (monotonic) bounds the wait for the node writers and
        ``end`` the whole wait, the primary's included, so that several sessions can share one bound."""
        if self._writers_done is None or self._waited:
            return
        self._waited = True
        if deadline is None:
            deadline = time.monotonic() + self._timeout + FLEET_SLACK_S
        if end is not None:
            deadline = min(deadline, end)
        self._writers_done.wait(max(0.0, deadline - time.monotonic()))
        self._after_writers(end)

    def abandon_uploads(self) -> tuple[list[str], str | None]:
        """An abort: upload no more checkpoints (see :meth:`PrimaryWriter.abandon_uploads`)."""
        return [], None

    def _after_writers(self, end: float | None = None) -> None:
        """What a waiting finish does once the node writers are done (or their bound passed)."""

    def _retire(self, exit_code: int, timeout: float) -> threading.Event:
        raise NotImplementedError


class SharedSession(RunSession):
    """A shared run: ``primary`` (its writer on the driver side, the fleet's ``target.primary``)
    and the fleet's node writers that join it."""

    def __init__(self, target: SharedTarget, primary: PrimaryWriter, fleet: NodeFleet, finish_timeout_s: float) -> None:
        super().__init__(fleet, finish_timeout_s)
        self.target = target  # the fleet's once started (AddRun): never read or changed here after
        self.primary = primary
        self._held: float | None = None  # when the latest report not sent to the fleet was made
        # What the ranks' reports feed, read before the hand-over: the fleet thread owns the monitor.
        self._health = target.health is not None
        self._metric_rule = target.health is not None and target.health.options.metric is not None
        self._wants_report = target.wants_report  # set by the fleet thread

    @property
    def run_id(self) -> str:
        return self.primary.spec.run_id

    def start(self) -> None:
        # The target first: the primary's thread may set the run's nodes before the run exists.
        self.fleet.start()
        self.fleet.add_run(self.target)
        self.primary.start(on_ready=functools.partial(self.fleet.run_ready, self.target))

    def update_config(self, config: dict[str, Any]) -> None:
        self.primary.update_config(config)

    def report(self, metrics: Any) -> None:
        if not self._finishing:
            self.primary.log(metrics)

    def report_ranks(self, metrics: list[dict[str, Any]], checkpoint: bool = False) -> None:
        """Every rank's report: its metrics for the straggler rule by metric (when it is on: every
        report goes to the fleet), its time and checkpoint for the idle-GPU rule. Without the
        metric rule only what the idle rule reads goes (a queue put each report was more than it
        needs): the ranks' first report after each worker-group start, or while the monitor waits
        for one (a node it learnt of later), and a report carrying a checkpoint, after the report
        before it (when the save began)."""
        if self._finishing or not self._health:
            return
        now = time.time()  # the monitor's clock: a node's samples are placed on it by their ages (_health/gpus.py)
        if self._metric_rule:
            self.fleet.rank_report(self.run_id, metrics, checkpoint, at=now)
        elif checkpoint or self._first or self._wants_report.is_set():
            if checkpoint and self._held is not None:
                self.fleet.rank_report(self.run_id, [], False, at=self._held)
            self.fleet.rank_report(self.run_id, [], checkpoint, at=now)
            self._first, self._held = False, None
        else:
            self._held = now

    def log_checkpoint(self, checkpoint: Any, name: str, aliases: list[str]) -> None:
        make = functools.partial(checkpoint_artifact, name=name, checkpoint=checkpoint)
        self.primary.log_artifact(make, aliases=aliases, name=name, where=str(checkpoint.path))

    def abandon_uploads(self) -> tuple[list[str], str | None]:
        return self.primary.abandon_uploads()

    def _retire(self, exit_code: int, timeout: float) -> threading.Event:
        # The exit code goes to the node writers too (they never send it): their ranks' console ends as it says.
        return self.fleet.retire_run(
            self.run_id, timeout, then=functools.partial(self.primary.request_finish, exit_code), exit_code=exit_code
        )

    def _after_writers(self, end: float | None = None) -> None:
        self.primary.request_finish(self._exit_code)  # idempotent; covers a fleet that could not hand over
        left = self._timeout if end is None else max(0.0, min(self._timeout, end - time.monotonic()))
        if self.primary.creating:
            # The run was never created (W&B unreachable, or slower than the whole training): there
            # is nothing to finish, and training must not wait for wandb.init to give up.
            why = "its run is still being created (is W&B reachable?)"
            self.primary.wait_done(min(UNCREATED_WAIT_S, left), why=why)
            return
        self.primary.wait_done(left)


class StandaloneSession(RunSession):
    def __init__(self, target: StandaloneTarget, fleet: NodeFleet, finish_timeout_s: float) -> None:
        super().__init__(fleet, finish_timeout_s)
        self.target = target

    @property
    def run_id(self) -> str:
        return self.target.run_id

    def start(self) -> None:
        self.fleet.start()
        self.fleet.add_run(self.target)

    def report(self, metrics: Any) -> None:
        if not self._finishing:
            self.fleet.log(self.run_id, metrics)

    def log_checkpoint(self, checkpoint: Any, name: str, aliases: list[str]) -> None:
        self.fleet.log_artifact(self.run_id, checkpoint, name, aliases)

    def _retire(self, exit_code: int, timeout: float) -> threading.Event:
        return self.fleet.retire_run(self.run_id, timeout, exit_code=exit_code)
