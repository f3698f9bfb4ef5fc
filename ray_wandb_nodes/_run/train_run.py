"""The W&B side of one Train run, on the Train controller: its sessions, one path for every strategy.

A strategy with a primary (shared, main) opens one session on the controller when the controller
starts; the others (node, all) open one standalone session per node or rank once the workers are
placed. What else a strategy implies (node writers, hang watching) the run asks the strategy
(``_config.values.Strategy``). Every report, checkpoint and the end go to the sessions the same
way; one node fleet serves them.
"""

from __future__ import annotations

import time
from typing import Any

from .._config.options import Options
from .._config.secrets import CapturedEnv
from .._config.values import ConsoleMode, Mode, NodeSelection, Strategy
from .._failure import FailedAttempt
from .._fleet import POLL_S, FailureWatch, HangWatch, NodeFleet, RelayPlan, SharedTarget, StandaloneTarget, poll_s
from .._health import HealthMonitor, HealthOptions
from .._ray import Placement, TrainStart
from .._wandb.artifacts import checkpoint_aliases
from .._wandb.metrics import config_for_wandb, flatten
from .._wandb.naming import LABELS, train_run_id
from .._wandb.strategies import PlannedRun, plan_runs, report_rows
from .._wandb.writers import primary_spec, run_spec
from .._warn import Warner
from ..offline.storage import StorageSpot, storage_spot
from .primary import PrimaryWriter
from .ray_hangs import RayHangRelay, relay_ray_hangs, stop_relay
from .session import FLEET_SLACK_S, RunSession, SharedSession, StandaloneSession

# The longest a worker-group start waits for its node writers (see TrainRun.await_writers).
STARTUP_WAIT_S = 30.0
ABORT_S = 10.0  # an abort's bound on the controller's event loop (finish_timeout_s when shorter)


def train_config(options: Options, start: TrainStart) -> dict[str, Any]:
    """The run config: the train loop config (with ``log_config``), the user's ``config`` over it,
    and what Ray Train says of the run under ``ray_train``."""
    config: dict[str, Any] = {}
    if options.log_config and start.train_loop_config:
        config.update(start.train_loop_config)
    config.update(options.config)
    config["ray_train"] = {
        "run_name": start.run_name,
        "num_workers": start.num_workers,
        "use_gpu": start.use_gpu,
        "strategy": options.strategy.value,
    }
    return config


def placement_config(placements: list[Placement]) -> dict[str, Any]:
    """What a worker group's placement adds to the run config: world size, ranks by node label."""
    by_node: dict[str, list[int]] = {}
    labels = LABELS.assign((p.hostname, p.node_id) for p in placements)
    for p in placements:
        by_node.setdefault(labels[p.node_id], []).append(p.rank)
    return {"ray_train": {"world_size": len(placements), "ranks_by_node": by_node}}


def abort_uploads_warning(bound: float, dropped: list[str], last: str | None) -> str:
    """The one warning of an abort with checkpoint uploads pending (pure)."""
    parts = []
    if dropped:  # one artifact name per run: say each once, with its count
        names = ", ".join(n if dropped.count(n) == 1 else f"{n} x{dropped.count(n)}" for n in dict.fromkeys(dropped))
        parts.append(f"{len(dropped)} checkpoint(s) not yet handed to W&B are dropped ({names})")
    if last:
        parts.append(f"the upload of {last}, the last one logged, is cut short if W&B has not finished it")
    return (
        f"the run was aborted: it ends within {bound:.0f}s without waiting for checkpoint uploads "
        f"(upload_timeout bounds a run's end, not an abort): {'; '.join(parts)}"
    )


def console_mode(options: Options) -> ConsoleMode:
    """What the run's Logs tab holds of the ranks' console: ``rank_console`` in the shared strategy
    (whose node writers read each node's ranks), else nothing."""
    return options.rank_console if options.strategy.node_writers else ConsoleMode.OFF


def health_options(options: Options) -> HealthOptions:
    """The node-health options of a Train run's shared or main run."""
    return HealthOptions(
        metric=options.straggler_metric,
        mode=options.straggler_mode,
        threshold=options.straggler_threshold,
        window_s=options.straggler_window_s,
        alerts=options.alerts,
        history_every_s=options.sampling_interval_s,  # the rank charts as fine as the system charts
    )


class TrainRun:
    def __init__(
        self,
        options: Options,
        env: CapturedEnv,
        warner: Warner,
        *,
        start: TrainStart,
        node_id: str,
        hostname: str,
        driver_cwd: str,
    ) -> None:
        self.options = o = options
        self._env, self._warner, self._driver_cwd = env, warner, driver_cwd
        self.run_name = start.run_name
        self.base_id = train_run_id(start.storage_path, self.run_name)
        self.node_id = node_id
        # Offline: where node writers put their runs for the controller when not through Ray:
        # the run's storage as the controller already resolved it (no second lookup here).
        self._storage: StorageSpot | None = None
        if o.mode is Mode.OFFLINE:
            self._storage, why_not = storage_spot(
                o.offline_transfer, start.experiment_fs_path, start.storage_filesystem
            )
            if why_not is not None:
                warner.warn("offline-storage", f"offline runs come through Ray: {why_not}")
        self.config = config_for_wandb(train_config(o, start), warner.warn)
        self._pg_timeout_s = start.pg_timeout_s
        # The ranks are watched where the strategy has node loggers to read their folders: how
        # they end (their own records of a failure, their processes) and, with hang detection, their beacons.
        self.watch_run = self.base_id if o.strategy.node_writers else None
        self.hang_run = self.base_id if o.hang_timeout_s.enabled and o.strategy.watches_hangs else None
        self._score_key = start.score_attribute
        self._score_max = start.score_order != "min"
        self._best: float | None = None
        poll = poll_s(o.hang_timeout_s, POLL_S) if self.hang_run else POLL_S
        # node writers there are (not in main), online: those without a route may send through a relay
        relay = RelayPlan.of(o, env, o.mode) if o.strategy is not Strategy.MAIN else None
        self.fleet = NodeFleet(
            init_timeout_s=o.init_timeout_s, warner=warner, poll_s=poll, relay=relay
        )  # started by its first session
        self._finished = False
        self._finished_ranks: frozenset[int] = frozenset()  # as last told the fleet
        self._reports = 0  # this attempt's reports (a hang's place counts from its last checkpoint)
        self.sessions: dict[str, RunSession] = {}
        self._ranks: dict[str, int | None] = {}  # run id -> the rank it logs; None: as rank_metrics says
        self._ray_hangs: RayHangRelay | None = None
        if o.strategy.primary:
            primary = self._open_primary(hostname)
            storage = (start.experiment_fs_path, start.storage_filesystem)
            self._ray_hangs = relay_ray_hangs(primary, primary.spec.label, storage, warner)
        if o.strategy.node_writers:  # loggers ready before the workers are placed (see await_writers)
            workers = start.num_workers if isinstance(start.num_workers, int) else start.max_workers
            self.fleet.prestart(
                use_gpu=bool(start.use_gpu), exclude=node_id, workers=workers, per_worker=start.resources_per_worker
            )

    def ranks_finished(self, ranks: frozenset[int]) -> None:
        """Ranks whose train function returned (Train's poll), for the run's hang watch on the
        fleet thread as they change: not judged, and progress during a hang."""
        if self.hang_run and ranks != self._finished_ranks:
            self._finished_ranks = ranks
            self.fleet.ranks_finished(self.hang_run, ranks)

    def attempt_failed(self, failed: FailedAttempt) -> None:
        """An attempt failed (Ray's controller decided on it): named in the shared or main run."""
        if self.options.strategy.primary:
            self.fleet.attempt_failed(self.base_id, failed)

    def attempt_recovered(self, attempt: int) -> None:
        """``attempt`` reported after an earlier one failed."""
        if self.options.strategy.primary:
            self.fleet.attempt_recovered(self.base_id, attempt)

    def _offline_storage(self, run_id: str) -> StorageSpot | None:
        return self._storage.for_run(run_id) if self._storage is not None else None

    def _add(self, session: RunSession, rank: int | None) -> None:
        self.sessions[session.run_id] = session
        self._ranks[session.run_id] = rank
        session.start()

    def _open_primary(self, hostname: str) -> PrimaryWriter:
        o = self.options
        node_writers = o.strategy.node_writers
        spec = primary_spec(
            o,
            self._env,
            mode=o.mode,
            run_id=self.base_id,
            label=LABELS.label(hostname, self.node_id),
            display_name=self.run_name,
            group=None,
            config=self.config,
            default_dir=self._driver_cwd,
            shared=node_writers,
        )
        primary = PrimaryWriter(spec, warner=self._warner, rows=report_rows(o.rank_metrics, o.excludes))
        target = SharedTarget(
            primary=primary,
            selection=o.nodes if node_writers else NodeSelection.WORKERS,
            covered_node=self.node_id,  # the primary samples its own node
            storage=self._offline_storage(self.base_id),
            health=HealthMonitor(health_options(o)),
            max_writers=o.max_node_writers if node_writers else None,
            hangs=HangWatch(o.hang_timeout_s, o.on_hang, self._pg_timeout_s) if self.hang_run else None,
            console=console_mode(o),
            failures=FailureWatch(),
        )
        if primary.index is not None:  # offline: the report judges GPUs by the run's own rules
            primary.index.update(health={"threshold": o.straggler_threshold, "window_s": o.straggler_window_s})
        self._add(SharedSession(target, primary, self.fleet, o.finish_timeout_s), rank=None)
        return primary

    def _open_standalone(self, planned: PlannedRun) -> RunSession:
        o = self.options
        spec = run_spec(
            o,
            self._env,
            mode=o.mode,
            run_id=planned.run_id,
            name=planned.name,
            group=o.group or self.run_name,
            label=planned.label,
            config={**self.config, "ray_train": {**self.config["ray_train"], "rank": planned.rank}},
            gpu_ids=planned.gpu_ids,
            default_dir=self._driver_cwd,
        )
        target = StandaloneTarget(writer=spec, excludes=o.excludes, storage=self._offline_storage(planned.run_id))
        self._add(StandaloneSession(target, self.fleet, o.finish_timeout_s), rank=planned.rank)
        return self.sessions[planned.run_id]

    def workers_placed(self, placements: list[Placement], attempt: str | None = None) -> None:
        """Where each rank runs now; ``attempt``: the key its ranks armed in for hangs (their folder)."""
        strategy = self.options.strategy
        if self.hang_run:  # an attempt starts, from the last checkpoint
            self._reports = 0
            self.fleet.checkpointed(self.hang_run, 0)
        if strategy.runs_per is None:  # the primary's run
            session = self.sessions[self.base_id]
            ranks: dict[str, list[int]] = {}
            for p in placements:
                ranks.setdefault(p.node_id, []).append(p.rank)
            # No node writers (main): its target never learns a node; its table does.
            session.set_nodes(
                set(ranks) if strategy.node_writers else (),
                self.node_id,
                ranks={n: tuple(r) for n, r in ranks.items()},
                rank_gpus={p.rank: p.gpu_ids for p in placements},
                attempt=attempt,
                pids={p.rank: p.pid for p in placements if p.pid is not None},
            )
            session.update_config(placement_config(placements))
            return
        for planned in plan_runs(strategy.runs_per, placements, self.base_id):
            session = self.sessions.get(planned.run_id) or self._open_standalone(planned)
            self._ranks[planned.run_id] = planned.rank  # a restart may place other ranks there
            session.set_nodes({planned.node_id})

    def attempt_ended(self, failed: bool) -> None:
        """The worker group shuts down (a restart, the end of training, a failure): its ranks'
        console ends, their last lines to the run when the attempt ``failed``."""
        session = self.sessions.get(self.base_id)
        if isinstance(session, SharedSession):
            session.attempt_ended(failed)

    def await_writers(self) -> None:
        """Wait (at most ``STARTUP_WAIT_S``, or ``init_timeout_s`` when shorter) until the node
        writers of the shared run have joined and sampled; at once for a run not created yet."""
        shared = [rid for rid, session in self.sessions.items() if isinstance(session, SharedSession)]
        bound = min(STARTUP_WAIT_S, self.options.init_timeout_s)
        # (a standalone run's writer creates its run: no join to wait for; and an unreachable
        # W&B must not hold training)
        if shared and not self.fleet.await_writers(shared, bound):
            self._warner.warn(
                f"startup-wait:{self.base_id}",
                f"node writers of {self.base_id} were not all ready {bound:.0f}s after the workers started; "
                "training starts now and their first samples come later",
            )

    def report(self, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        self._reports += 1
        if self.hang_run and checkpoint is not None:
            self.fleet.checkpointed(self.hang_run, self._reports)
        for run_id, session in self.sessions.items():
            rank = self._ranks[run_id]
            if rank is None:
                # No copy on the controller's event loop: the writer thread builds its own row from
                # Ray's dicts and never changes them, and Ray hands a report's dicts to the report
                # callbacks after taking them off its queues, then drops them.
                session.report(list(metrics) if self.options.rank_metrics.every_rank else metrics[0])
                session.report_ranks(metrics, checkpoint is not None)
            elif rank < len(metrics):
                session.report(metrics[rank])
        if checkpoint is not None and self.options.upload_checkpoints:
            self._log_checkpoint(checkpoint, metrics[0])

    def _log_checkpoint(self, checkpoint: Any, rank0: dict[str, Any]) -> None:
        score = flatten(rank0).get(self._score_key) if self._score_key else None
        aliases, self._best = checkpoint_aliases(score, self._best, self._score_max)
        owner = next((rid for rid, rank in self._ranks.items() if rank in (None, 0)), None)
        if owner is not None:
            self.sessions[owner].log_checkpoint(checkpoint, f"checkpoint-{self.base_id}", aliases)

    def abort(self) -> None:
        """The controller exits right after an abort: end fast (within ``ABORT_S``, or
        ``finish_timeout_s`` when shorter, whatever uploads are pending), as failed, without the
        last node table (wandb uploads a table as an artifact, which an exiting controller cuts short)."""
        if self._finished:  # an abort is seen by two hooks on some Ray releases
            return
        bound = min(ABORT_S, self.options.finish_timeout_s)
        dropped: list[str] = []
        last: str | None = None
        for session in self.sessions.values():
            if isinstance(session, SharedSession):
                self.fleet.end_health(session.run_id)
            names, logged = session.abandon_uploads()
            dropped += names
            last = logged or last
        if dropped or last:
            self._warner.warn(f"abort-uploads:{self.base_id}", abort_uploads_warning(bound, dropped, last))
        self.finish(exit_code=1, timeout=bound, abort=True)

    def finish(self, exit_code: int, timeout: float, *, abort: bool = False) -> None:
        """Every run (node writers first, then the primary, or each run of its own), then every
        actor, all within one bound on the controller's event loop: ``timeout``, raised to
        ``upload_timeout`` for checkpoint uploads unless it is an ``abort``."""
        if self._finished:  # an abort is seen by two hooks on some Ray releases
            return
        self._finished = True
        o = self.options
        wait = max(timeout, o.upload_timeout) if o.upload_checkpoints and not abort else timeout
        stop_relay(self._ray_hangs, min(5.0, wait / 4))  # before the primary's end: a hang's files reach it
        stop = time.monotonic() + wait  # every wait below ends by then
        end = stop - min(1.0, wait / 10)  # the runs' end; the rest stops the fleet
        writers = wait - min(wait / 4, FLEET_SLACK_S)  # node writers first; the primary has the rest
        for session in self.sessions.values():
            session.finish(exit_code, timeout=writers)
        for session in self.sessions.values():
            session.wait_finished(end, end=end)
        # Every attempt's folder is removed with its last process, on this node by the fleet and on
        # the others by their loggers (see _fleet/watches.py).
        self.fleet.shutdown(max(0.0, stop - time.monotonic()), slack_s=0.0)
