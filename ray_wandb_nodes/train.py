"""``WandbNodesCallback``: the Ray Train V2 adapter.

It subclasses Train's internal callback classes (DeveloperAPI; Ray 2.50 to 2.60, see
``_ray.py`` for what each release has), because only they expose the controller lifecycle and
the worker placement; the public
``UserCallback`` has neither. It must not also subclass ``UserCallback``: Train routes
such objects only through its user-callback handler and never calls their other hooks.

Every hook runs on the Train controller actor's event loop. Hooks only hand data to the
run session's background threads, and no exception leaves them: a raise in a Train hook
fails the whole run.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, Literal

from . import _ray
from ._config.setup import configure
from ._ray.failures import max_failures
from ._run import handoff as _handoff
from ._run.train_failures import AttemptFailures
from ._run.train_run import TrainRun
from ._run.train_workers import TrainWorkers
from ._run.trial_relay import TrialRelay
from ._warn import Warner, describe, guarded

# Train V2's callback classes of this Ray (``(object,)`` on a Ray without them: then building the
# callback says which Ray is needed).
_BASES = _ray.train_callback_bases()

if TYPE_CHECKING:
    from ray.train.v2._internal.execution.context import TrainRunContext
    from ray.train.v2._internal.execution.worker_group import WorkerGroup
    from ray.train.v2.api.result import Result


class WandbNodesCallback(*_BASES):  # type: ignore[misc]
    """One W&B run that shows every node of a Ray Train run (or the classic strategies).

    Add it to ``ray.train.RunConfig(callbacks=[WandbNodesCallback(project="my-proj")])``.
    With the default ``strategy="shared"`` the Train controller becomes the run's primary
    writer (rank 0's reports, config, checkpoints, final state) and every other node hosting
    train workers gets a ``NodeLogger`` actor that joins the same run in W&B shared mode, so
    each node's GPU, CPU, memory, disk and network metrics appear in the run, labelled
    ``node-<hostname>-<node id>``. The shared and main runs hold a ``nodes`` table (every
    minute and at the end) with each node's latest samples and its state.

    Args:
        project: the W&B project; None: ``WANDB_PROJECT``, else wandb's default project
        entity: the W&B entity (team or user); None: ``WANDB_ENTITY``, else your default entity
        group: the W&B group; None: the Ray run name (Train's ``node`` and ``all`` strategies) or the experiment
            (Tune)
        name: the run's display name; None: the Ray run name (``RunConfig.name``)
        tags: the run's W&B tags
        notes: the run's W&B notes
        config: extra run config, merged over the train loop config
        log_config: log the config: the train loop config into the run config (Train), each result's ``config``
            (Tune)
        mode: ``online``, ``offline`` or ``disabled``; None: ``WANDB_MODE`` (``WANDB_DISABLED=true``: disabled),
            else ``online``
        excludes: metric keys not to log: a key, or a prefix of nested keys (``opt`` drops ``opt/lr``)
        strategy: ``shared`` (one run that every node's writer joins), ``main`` (one run, the controller's node
            only), ``node`` (one run per node, grouped) or ``all`` (one run per rank, grouped)
        rank_metrics: what the shared or main run logs of each report: ``rank0`` (rank 0's keys), ``reduce``
            (mean, min, max, std, argmax and argmin rank of every numeric key across ranks) or ``all``
            (``rank_<r>/key``)
        rank_console: what the shared run's Logs tab holds of what the ranks print (stdout and stderr, read from
            Ray's worker log files on each node, labelled ``[rank N]``): ``rank0`` (rank 0's console, and every
            rank's last lines when an attempt fails), ``all`` (every rank's), ``failures`` (only every rank's
            last lines when an attempt fails) or ``off``
        nodes: ``workers``: the nodes hosting train workers (Train) or a trial (Tune); ``cluster``: every alive
            node, new ones included
        sampling_interval_s: the system-metric sampling interval on every node
        gpu_device_ids: the GPU indices to sample on every node; None: all
        upload_checkpoints: log each reported checkpoint as an artifact (local folders uploaded, remote ones
            referenced), aliased ``latest`` (and ``best`` in Train)
        upload_timeout: how long a run's end waits for checkpoint uploads (an abort does not wait for them)
        straggler_metric: the reported key (flattened: ``samples_per_s``, ``perf/tokens_per_s``) nodes are
            compared by, a node's value the median of its ranks'; None: GPU utilisation, or CPU on nodes without
            GPUs
        straggler_mode: whether a higher (``max``) or a lower (``min``) ``straggler_metric`` is better
        straggler_threshold: a node is a straggler once its value stays worse than this fraction of the other
            nodes' median (``min``: above the median / threshold)
        straggler_window_s: for how long (and at least 3 samples) before a node counts as a straggler, or as
            recovered
        alerts: W&B alerts when a node becomes a straggler, recovers or is lost (the ``nodes`` table, the
            warnings and ``nodes/stragglers`` stay without)
        hang_timeout_s: seconds without progress (a report or an optimizer step) after which a rank is hung and
            every rank's evidence is taken; ``auto``: max(120 s, 5 x the slowest interval of the last hour), 3 x
            in the first step, saves and evaluations, always below the process-group timeout; None: off
        on_hang: what a hang does: ``alert`` (an ERROR alert, the ``hangs`` table and every rank's stacks in the
            run) or ``restart`` (the same, then the hung attempt is ended so that ``FailureConfig`` restarts it
            from the last checkpoint)
        init_timeout_s: how long a writer may take to create or join the run
        finish_timeout_s: the bound on finishing the node writers, then on finishing the run
        max_node_writers: at most this many node writers join one shared run (W&B tests about 300 a run); past
            it, each kind of node, the lowest ranks and any straggler write, the other nodes are in the
            ``nodes`` table only, and one warning says so
        offline_transfer: how each node's offline run reaches the driver side at the end: ``ray`` (through Ray,
            up to 2 GiB a node), ``storage`` (the run's storage path, which every node must reach) or ``auto``
            (the storage unless it is this machine's local file system, else Ray); a node that cannot use the
            storage falls back to Ray
        egress: how node writers reach W&B: ``direct`` (each from its own node; a node without a route writes
            offline and its series are brought into the run at its end, with one warning) or ``relay`` (a node
            without a route sends live through a relay on the Train controller's node, or the Tune driver's)
        egress_hosts: with ``egress='relay'``, more hosts the relay tunnels to besides the run's W&B host and
            its storage host: ``host`` (port 443), ``host:port``, or ``*.sub.domain`` (its subdomains; never a
            public suffix or a whole registrable domain, as the Public Suffix List has them)
        api_key: the W&B API key; None: ``WANDB_API_KEY``, then the netrc entry; it reaches every node inside
            the callback, never through ``runtime_env`` or the run config
        api_key_file: a file holding the W&B API key (give this or ``api_key``, not both)
        **wandb_init_kwargs: passed on to the primary's ``wandb.init`` (``job_type``, ``resume``, ``dir``, ...);
            ``settings`` (a dict or ``wandb.Settings``) applies to every writer, less the fields that decide
            each writer's role
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        group: str | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        config: dict[str, Any] | None = None,
        log_config: bool = True,
        mode: Literal["online", "offline", "disabled"] | None = None,
        excludes: list[str] | None = None,
        strategy: Literal["shared", "main", "node", "all"] = "shared",
        rank_metrics: Literal["rank0", "reduce", "all"] = "rank0",
        rank_console: Literal["rank0", "all", "failures", "off"] = "rank0",
        nodes: Literal["workers", "cluster"] = "workers",
        sampling_interval_s: float = 15.0,
        gpu_device_ids: list[int] | None = None,
        upload_checkpoints: bool = False,
        upload_timeout: float = 1800.0,
        straggler_metric: str | None = None,
        straggler_mode: Literal["max", "min"] = "max",
        straggler_threshold: float = 0.7,
        straggler_window_s: float = 120.0,
        alerts: bool = True,
        hang_timeout_s: float | Literal["auto"] | None = "auto",
        on_hang: Literal["alert", "restart"] = "alert",
        init_timeout_s: float = 90.0,
        finish_timeout_s: float = 60.0,
        max_node_writers: int = 256,
        offline_transfer: Literal["auto", "ray", "storage"] = "auto",
        egress: Literal["direct", "relay"] = "direct",
        egress_hosts: list[str] | None = None,
        api_key: str | None = None,
        api_key_file: str | None = None,
        **wandb_init_kwargs: Any,
    ) -> None:
        _ray.check_ray(train=True)
        self.options, self._env = configure("train", locals())  # the arguments above, by the table
        self._driver_cwd = os.getcwd()
        self._warner = Warner()
        self._run: TrainRun | None = None
        # Built inside a Tune trial: maybe that trial's W&B run is the run (see _handoff).
        self._tune_trial_id = _ray.current_trial_id() if self.options.mode.logs else None
        self._relay: TrialRelay | None = None  # inside a trial whose run is the run (see _handoff)
        self._workers = TrainWorkers(self._warner)  # where the ranks run, and the attempt they arm in
        self._failures = AttemptFailures()  # the current attempt's failure, as Train's hooks show it

    def __repr__(self) -> str:
        o = self.options
        return (
            f"WandbNodesCallback(project={o.project!r}, mode={o.mode.value!r}, strategy={o.strategy.value!r}, "
            f"nodes={o.nodes.value!r})"
        )

    def __getstate__(self) -> dict[str, Any]:  # runtime state never travels
        return {**self.__dict__, "_run": None, "_relay": None}

    @property
    def run_id(self) -> str | None:
        """The W&B run id (the group's base id for the node and all strategies), once started."""
        return self._run.base_id if self._run else None

    # ControllerCallback --------------------------------------------------------------------
    @guarded("after_controller_start")
    def after_controller_start(self, train_run_context: TrainRunContext) -> None:
        if not self.options.mode.logs or self._run is not None or self._relay is not None:
            return
        mark = _handoff.trial_mark(self._tune_trial_id) if self._tune_trial_id else None
        if self._tune_trial_id and mark:
            # Inside a trial that WandbNodesTuneCallback logs: the trial's run is the run;
            # this callback only tells it where the train workers are, and how to watch them.
            self._relay = TrialRelay(self._tune_trial_id, self._warner)
            hangs = self._relay.hangs(mark, self.options, train_run_context) is not None
            self._workers.watch(mark.run_id or None, hangs)
            self._failures = AttemptFailures(max_failures(train_run_context), sink=self._relay)
            return
        import ray

        self._run = TrainRun(
            self.options,
            self._env,
            self._warner,
            start=_ray.train_start(train_run_context),
            node_id=ray.get_runtime_context().get_node_id(),
            hostname=socket.gethostname(),
            driver_cwd=self._driver_cwd,
        )
        self._workers.watch(self._run.watch_run, hangs=self._run.hang_run is not None)
        self._failures = AttemptFailures(max_failures(train_run_context), sink=self._run)

    @guarded("after_controller_finish")
    def after_controller_finish(self, result: Result) -> None:
        if self._run is not None:
            self._run.finish(exit_code=1 if _ray.result_failed(result) else 0, timeout=self.options.finish_timeout_s)

    @guarded("before_controller_abort")
    def before_controller_abort(self) -> None:
        self._abort()

    @guarded("after_controller_state_update")
    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        # Up to Ray 2.54 an abort fires no abort hook, only this update to the aborted state;
        # from 2.55 both fire (the abort hook first), and the run ends once.
        if _ray.is_aborted(current_state):
            self._abort()

    @guarded("before_controller_execute_failure_decision")
    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        """Ray decided what a failure does (retry or raise): the failed attempt goes to the run, named
        there from what the failing poll said and what each node saw (on the fleet thread)."""
        self._failures.decided(failure_decision, self._workers.placements.values(), self._workers.attempt)

    def _abort(self) -> None:
        # The controller exits right after an abort: finish fast, as failed.
        if self._run is not None:
            self._run.abort()

    # WorkerGroupCallback and, from Ray 2.56, ReplicaGroupCallback -------------------------------
    @guarded("before_worker_group_start")
    def before_worker_group_start(self, worker_group_context: Any) -> None:
        """A worker group starts (its first, or a restart; a replaced replica group is no new group
        and calls no such hook, Ray 2.47 to 2.60): its ranks arm in an attempt of their own."""
        self._workers.new_group()
        self._failures.new_group()

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        """The earliest moment the workers' nodes are known (their actors exist; the train
        function has not started): the ranks are armed and the node writers start joining now."""
        try:
            self._workers.arm(workers)  # ahead of Train's own calls there, the process group's included
            if self._run is not None or self._relay is not None:
                # every rank of a worker group, or (2.56+) the ranks of a replaced replica group
                self._workers.placements.update((p.rank, p) for p in _ray.placements_of(workers))
                self._placed()
        except Exception as e:  # noqa: BLE001 - a raise here fails the run
            self._warner.warn(f"hook:before_init_train_context:{type(e).__name__}", describe(e))
        return {}  # no train-context arguments of ours

    @guarded("after_worker_group_start")
    def after_worker_group_start(self, worker_group: WorkerGroup) -> None:
        if self._run is not None or self._relay is not None:
            placements = {p.rank: p for p in _ray.worker_placements(worker_group)}
            if placements != self._workers.placements:  # before_init_train_context told the fleet already
                self._workers.placements = placements
                self._placed()
        if self._run is not None:
            # Right before Ray launches the train function: hold it (bounded) until every node writer
            # has joined and sampled, so the set-up inside the function is seen on every node.
            self._run.await_writers()
        if self._run is not None or self._relay is not None:  # last: a rank's hang clock starts with its train function
            self._workers.setup(worker_group, self._setup_run_id())

    @guarded("before_worker_group_shutdown")
    def before_worker_group_shutdown(self, worker_group: WorkerGroup) -> None:
        """The worker group's attempt ends (a restart, the end of training, a failure; Ray 2.50 to
        2.60 call it before ending the workers): its ranks' console ends, every rank's last lines
        to the run when one of its polls held an error."""
        if self._run is not None:
            self._run.attempt_ended(self._failures.failed)

    @guarded("after_replica_group_start")
    def after_replica_group_start(self, replica_group: Any) -> None:
        # A replica group replaced (Ray 2.56+, TorchFT-style fault tolerance): only its workers
        # are new, maybe on other nodes; Ray calls no worker-group hook for it.
        if self._run is not None or self._relay is not None:
            self._failures.replaced()  # the failed replica's ranks ended with their processes (their console too)
            self._workers.placements.update((p.rank, p) for p in _ray.worker_placements(replica_group))
            self._placed()
            self._workers.setup(replica_group, self._setup_run_id())

    def _setup_run_id(self) -> str | None:
        """The run a worker's set-up names (its frameworks' runs quieted for it)."""
        return self.run_id or (self._relay.trial_id if self._relay is not None else None)

    def _placed(self) -> None:
        w = self._workers
        placements = [w.placements[rank] for rank in sorted(w.placements)]
        if self._relay is not None:
            self._relay.placed(placements, w.attempt)
            return
        assert self._run is not None
        self._run.workers_placed(placements, attempt=w.attempt)

    @guarded("after_worker_group_poll_status")
    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        """Train's poll of the workers: the first with a rank's error is what Ray decides on (kept
        for the failure decision, and the attempt's ranks' last lines go to the run at its end); the
        ranks whose train function returned (not those that failed) are not judged for hangs, and
        are progress during one (inside a Tune trial, through the hand-off to the trial's run)."""
        self._failures.polled(worker_group_status, self._workers.group)  # the first failing poll: the attempt failed
        if self._workers.hang_run and self._run is not None:
            self._run.ranks_finished(_ray.finished_ranks(worker_group_status))
        elif self._workers.hang_run and self._relay is not None:
            self._relay.finished(_ray.finished_ranks(worker_group_status))

    # ReportCallback --------------------------------------------------------------------------
    @guarded("after_report")
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self._failures.reported()  # after a retry, its first report: the attempt recovered
        if self._run is not None and metrics:
            self._run.report(metrics, _ray.report_checkpoint(training_report))
        elif self._relay is not None:
            self._relay.reported(_ray.report_checkpoint(training_report) is not None)
