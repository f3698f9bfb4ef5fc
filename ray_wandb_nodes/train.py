"""``WandbNodesCallback``: the Ray Train V2 adapter.

It subclasses Train's internal callback classes (DeveloperAPI; Ray 2.50 to 2.60, see
``_ray.py`` for what each release has), because only they expose the controller lifecycle and
the worker placement; the public
``UserCallback`` has neither. It must not also subclass ``UserCallback``: Train routes
such objects only through its user-callback handler and never calls their other hooks.

Every hook runs on the Train controller actor's event loop. Hooks only translate Ray's call into
one on the ``TrainController`` (``_run/train_controller.py``), which hands data to the run
session's background threads, and no exception leaves them: a raise in a Train hook fails the
whole run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from . import _ray
from ._config.setup import configure
from ._run.train_controller import TrainController
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
        self._warner = Warner()
        # What the hooks do, in order, with the run they write to (its own, or a Tune trial's).
        self._controller = TrainController(self.options, self._env, self._warner, driver_cwd=os.getcwd())

    def __repr__(self) -> str:
        o = self.options
        return (
            f"WandbNodesCallback(project={o.project!r}, mode={o.mode.value!r}, strategy={o.strategy.value!r}, "
            f"nodes={o.nodes.value!r})"
        )

    @property
    def run_id(self) -> str | None:
        """The W&B run id (the group's base id for the node and all strategies), once started."""
        return self._controller.run_id

    # ControllerCallback --------------------------------------------------------------------
    @guarded("after_controller_start")
    def after_controller_start(self, train_run_context: TrainRunContext) -> None:
        self._controller.start(train_run_context)

    @guarded("after_controller_finish")
    def after_controller_finish(self, result: Result) -> None:
        self._controller.finish(result)

    @guarded("before_controller_abort")
    def before_controller_abort(self) -> None:
        self._controller.abort()

    @guarded("after_controller_state_update")
    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        # Up to Ray 2.54 an abort fires no abort hook, only this update to the aborted state;
        # from 2.55 both fire (the abort hook first), and the run ends once.
        if _ray.is_aborted(current_state):
            self._controller.abort()

    @guarded("before_controller_execute_failure_decision")
    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        """Ray decided what a failure does (retry or raise): the failed attempt goes to the run, named
        there from what the failing poll said and what each node saw (on the fleet thread)."""
        self._controller.failure_decided(failure_decision)

    # WorkerGroupCallback and, from Ray 2.56, ReplicaGroupCallback -------------------------------
    @guarded("before_worker_group_start")
    def before_worker_group_start(self, worker_group_context: Any) -> None:
        """A worker group starts (its first, or a restart; a replaced replica group is no new group
        and calls no such hook, Ray 2.47 to 2.60): its ranks arm in an attempt of their own."""
        self._controller.group_starts()

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        """The earliest moment the workers' nodes are known (their actors exist; the train
        function has not started): the ranks are armed and the node writers start joining now."""
        try:
            self._controller.workers_known(workers)
        except Exception as e:  # noqa: BLE001 - a raise here fails the run
            self._warner.warn(f"hook:before_init_train_context:{type(e).__name__}", describe(e))
        return {}  # no train-context arguments of ours

    @guarded("after_worker_group_start")
    def after_worker_group_start(self, worker_group: WorkerGroup) -> None:
        """Right before Ray launches the train function: the fleet told of any placement it missed, the
        launch held (bounded) until every node writer has joined, then each worker's set-up."""
        self._controller.group_started(worker_group)

    @guarded("before_worker_group_shutdown")
    def before_worker_group_shutdown(self, worker_group: WorkerGroup) -> None:
        """The worker group's attempt ends (a restart, the end of training, a failure; Ray 2.50 to
        2.60 call it before ending the workers): its ranks' console ends, every rank's last lines
        to the run when one of its polls held an error."""
        self._controller.group_ends()

    @guarded("after_replica_group_start")
    def after_replica_group_start(self, replica_group: Any) -> None:
        # A replica group replaced (Ray 2.56+, TorchFT-style fault tolerance): only its workers
        # are new, maybe on other nodes; Ray calls no worker-group hook for it.
        self._controller.replica_group_started(replica_group)

    @guarded("after_worker_group_poll_status")
    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        """Train's poll of the workers: the first with a rank's error is what Ray decides on (kept
        for the failure decision, and the attempt's ranks' last lines go to the run at its end); the
        ranks whose train function returned (not those that failed) are not judged for hangs, and
        are progress during one (inside a Tune trial, through the hand-off to the trial's run)."""
        self._controller.polled(worker_group_status)

    # ReportCallback --------------------------------------------------------------------------
    @guarded("after_report")
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        self._controller.reported(training_report, metrics)
