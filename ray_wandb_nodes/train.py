"""``WandbNodesCallback``: the Ray Train V2 adapter.

It subclasses Train's internal callback classes (DeveloperAPI in Ray 2.60), because only
they expose the controller lifecycle and the worker placement; the public
``UserCallback`` has neither. It must not also subclass ``UserCallback``: Train routes
such objects only through its user-callback handler and never calls their other hooks.

Every hook runs on the Train controller actor's event loop. Hooks only hand data to the
run session's background threads, and no exception leaves them: a raise in a Train hook
fails the whole run.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from . import _handoff
from ._artifacts import checkpoint_artifact
from ._fleet import NodeFleet, RunTarget
from ._metrics import config_for_wandb, flatten, to_row
from ._naming import node_label, train_run_id
from ._primary import PrimaryWriter
from ._session import RunSession
from ._setup import configure
from ._strategies import Placement, PlannedRun, combine_ranks, plan_runs
from ._warn import Warner, describe, guarded
from ._writers import primary_spec, run_spec
from .offline.storage import StorageSpot, storage_spot

SUPPORTED_RAY = ">=2.60,<2.61"

try:
    from ray.train.v2._internal.execution.callback import (
        ControllerCallback,
        ReportCallback,
        WorkerGroupCallback,
    )
except ImportError as _e:  # pragma: no cover - depends on the installed Ray
    try:
        import ray as _ray

        _found = f"ray {_ray.__version__}"
    except ImportError:
        _found = "no ray"
    raise ImportError(
        f"ray_wandb_nodes.WandbNodesCallback needs Ray Train V2's callback API (ray[train]{SUPPORTED_RAY}); "
        f"found {_found}. Install a supported Ray: pip install 'ray[train,tune]{SUPPORTED_RAY}'"
    ) from _e

if TYPE_CHECKING:
    from ray.train.v2._internal.execution.context import TrainRunContext
    from ray.train.v2._internal.execution.worker_group import WorkerGroup
    from ray.train.v2.api.result import Result


class WandbNodesCallback(ControllerCallback, WorkerGroupCallback, ReportCallback):  # type: ignore[misc]
    """One W&B run that shows every node of a Ray Train run (or the classic strategies).

    Add it to ``ray.train.RunConfig(callbacks=[WandbNodesCallback(project="my-proj")])``.
    With the default ``strategy="shared"`` the Train controller becomes the run's primary
    writer (rank 0's reports, config, checkpoints, final state) and every other node hosting
    train workers gets a ``NodeLogger`` actor that joins the same run in W&B shared mode, so
    each node's GPU, CPU, memory, disk and network metrics appear in the run, labelled
    ``node-<hostname>-<node id>``.

    Args:
        project, entity, group, name, tags, notes: as in ``wandb.init``. ``project`` and
            ``entity`` default to ``WANDB_PROJECT``/``WANDB_ENTITY``; ``name`` to the Ray
            run name; ``group`` (node and all strategies) to the Ray run name.
        config: extra run config, merged over the train loop config.
        log_config: put ``train_loop_config`` into the run config (default True).
        excludes: metric keys not to log (exact, or a ``/`` prefix of nested keys).
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; default ``WANDB_MODE``, else online.
        nodes: ``"workers"`` (nodes hosting train workers, default) or ``"cluster"`` (every
            alive node).
        strategy: ``"shared"`` (one run, every node's writer joins it), ``"main"`` (one run,
            the controller's node only), ``"node"`` (one run per node, grouped) or ``"all"``
            (one run per rank, grouped).
        rank_metrics: what the shared or main run logs of each report: ``"rank0"``,
            ``"reduce"`` (mean, min, max, std, argmax and argmin rank of every numeric key
            across ranks) or ``"all"`` (``rank_<r>/key``).
        upload_checkpoints: log every reported checkpoint as a ``model`` artifact (local
            folders uploaded, remote ones referenced), aliased ``latest`` and ``best``.
        upload_timeout: how long the end of the run waits for artifact uploads.
        sampling_interval_s: system-metric sampling interval (default 15 s, at least 0.1).
        gpu_device_ids: GPU indices to sample on every node (default all).
        init_timeout_s, finish_timeout_s: bounds on joining and finishing the run.
        offline_transfer: how, in offline mode, each node's offline run reaches the driver
            side at the end: ``"ray"`` (through Ray in chunks, up to 2 GiB a node),
            ``"storage"`` (through the run's ``storage_path``, which every node must reach)
            or ``"auto"`` (default: the storage unless it is this machine's local file
            system, else Ray). A node that cannot use the storage falls back to Ray.
        api_key, api_key_file: the W&B key (default ``WANDB_API_KEY``, then the netrc
            entry); it reaches every node inside the callback, never through
            ``runtime_env`` or the run config.
        **wandb_init_kwargs: passed on to the primary's ``wandb.init`` (``settings`` apply
            to every writer, less the fields that decide each writer's role).
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
        excludes: list[str] | None = None,
        mode: str | None = None,
        nodes: str = "workers",
        strategy: str = "shared",
        rank_metrics: str = "rank0",
        upload_checkpoints: bool = False,
        upload_timeout: float = 1800.0,
        sampling_interval_s: float = 15.0,
        gpu_device_ids: list[int] | None = None,
        init_timeout_s: float = 90.0,
        finish_timeout_s: float = 60.0,
        offline_transfer: str = "auto",
        api_key: str | None = None,
        api_key_file: str | None = None,
        **wandb_init_kwargs: Any,
    ) -> None:
        from ray.train.v2._internal.constants import is_v2_enabled

        if not is_v2_enabled():
            raise RuntimeError(
                "ray_wandb_nodes.WandbNodesCallback needs Ray Train V2, but RAY_TRAIN_V2_ENABLED=0 "
                "is set; unset it (V2 is the default in Ray 2.60)"
            )
        self.options, self._env = configure(
            project=project,
            entity=entity,
            group=group,
            name=name,
            tags=tags,
            notes=notes,
            config=config,
            log_config=log_config,
            excludes=excludes,
            mode=mode,
            nodes=nodes,
            strategy=strategy,
            rank_metrics=rank_metrics,
            upload_checkpoints=upload_checkpoints,
            upload_timeout=upload_timeout,
            sampling_interval_s=sampling_interval_s,
            gpu_device_ids=gpu_device_ids,
            init_timeout_s=init_timeout_s,
            finish_timeout_s=finish_timeout_s,
            offline_transfer=offline_transfer,
            api_key=api_key,
            api_key_file=api_key_file,
            wandb_init_kwargs=wandb_init_kwargs,
        )
        self._driver_cwd = os.getcwd()
        self._warner = Warner()
        self._run: _TrainRun | None = None
        # Built inside a Tune trial: maybe that trial's W&B run is the run (see _handoff).
        self._tune_trial_id = _handoff.current_trial_id() if self.options.mode != "disabled" else None
        self._relay_trial: str | None = None

    def __repr__(self) -> str:
        o = self.options
        return f"WandbNodesCallback(project={o.project!r}, mode={o.mode!r}, strategy={o.strategy!r}, nodes={o.nodes!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_run=None, _relay_trial=None)  # runtime state never travels
        return state

    @property
    def run_id(self) -> str | None:
        """The W&B run id (the group's base id for the node and all strategies), once started."""
        return self._run.base_id if self._run else None

    # ControllerCallback --------------------------------------------------------------------
    @guarded("after_controller_start")
    def after_controller_start(self, train_run_context: TrainRunContext) -> None:
        if self.options.mode == "disabled" or self._run is not None or self._relay_trial:
            return
        if self._tune_trial_id and _handoff.trial_mark(self._tune_trial_id):
            # Inside a trial that WandbNodesTuneCallback logs: the trial's run is the run;
            # this callback only tells it where the train workers are.
            self._relay_trial = self._tune_trial_id
            return
        self._run = _TrainRun(self, train_run_context)

    @guarded("after_controller_finish")
    def after_controller_finish(self, result: Result) -> None:
        if self._run is not None:
            self._run.finish(exit_code=1 if result.error is not None else 0, timeout=self.options.finish_timeout_s)

    @guarded("before_controller_abort")
    def before_controller_abort(self) -> None:
        # The controller exits right after this hook: finish fast, as failed.
        if self._run is not None:
            self._run.finish(exit_code=1, timeout=min(10.0, self.options.finish_timeout_s))

    # WorkerGroupCallback ---------------------------------------------------------------------
    @guarded("after_worker_group_start")
    def after_worker_group_start(self, worker_group: WorkerGroup) -> None:
        if self._run is None and not self._relay_trial:
            return
        placements = [
            Placement(
                rank=w.distributed_context.world_rank if w.distributed_context else i,
                node_id=w.metadata.node_id,
                hostname=w.metadata.hostname,
                gpu_ids=_gpu_ids(w.metadata.accelerator_ids),
            )
            for i, w in enumerate(worker_group.get_workers())
        ]
        if self._relay_trial:
            trial_id = self._relay_trial
            published = [{"node_id": p.node_id, "hostname": p.hostname, "rank": p.rank} for p in placements]
            # A GCS write: off the controller's event loop like everything else.
            threading.Thread(target=_publish, args=(trial_id, published, self._warner), daemon=True).start()
            return
        assert self._run is not None
        self._run.workers_placed(placements)

    # ReportCallback --------------------------------------------------------------------------
    @guarded("after_report")
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        if self._run is not None and metrics:
            self._run.report(metrics, getattr(training_report, "checkpoint", None))


class _TrainRun:
    """The W&B side of one Train run, on the controller: a shared or main run with its
    primary writer, or the runs of the node or all strategy, all served by one node fleet."""

    def __init__(self, callback: WandbNodesCallback, ctx: TrainRunContext) -> None:
        import ray

        self.options = o = callback.options
        self._env = callback._env
        self._warner = callback._warner
        self._driver_cwd = callback._driver_cwd
        run_config = ctx.run_config
        self.run_name = str(run_config.name)
        self.base_id = train_run_id(str(run_config.storage_path), self.run_name)
        self.mode = o.mode or "online"
        # Offline: where node writers put their runs for the controller when not through Ray:
        # the run's storage as the controller already resolved it (no second lookup here).
        self._storage: StorageSpot | None = None
        if self.mode == "offline":
            storage = getattr(run_config, "storage_context", None)
            self._storage, why_not = storage_spot(
                o.offline_transfer,
                getattr(storage, "experiment_fs_path", None),
                getattr(storage, "storage_filesystem", None),
            )
            if why_not is not None:
                self._warner.warn("offline-storage", f"offline runs come through Ray: {why_not}")
        config: dict[str, Any] = {}
        if o.log_config and ctx.train_loop_config:
            config.update(ctx.train_loop_config)
        config.update(o.config)
        scaling = ctx.scaling_config
        config["ray_train"] = {
            "run_name": self.run_name,
            "num_workers": getattr(scaling, "num_workers", None),
            "use_gpu": getattr(scaling, "use_gpu", None),
            "strategy": o.strategy,
        }
        self.config = config_for_wandb(config, self._warner.warn)
        checkpointing = run_config.checkpoint_config
        self._score_key = getattr(checkpointing, "checkpoint_score_attribute", None)
        self._score_max = getattr(checkpointing, "checkpoint_score_order", "max") != "min"
        self._best: float | None = None
        self.node_id = ray.get_runtime_context().get_node_id()
        self.fleet = NodeFleet(init_timeout_s=o.init_timeout_s, warner=self._warner)
        self.session: RunSession | None = None
        self.planned: dict[str, PlannedRun] = {}
        if o.strategy in ("shared", "main"):
            spec = primary_spec(
                o,
                self._env,
                mode=self.mode,
                run_id=self.base_id,
                label=node_label(socket.gethostname(), self.node_id),
                display_name=self.run_name,
                group=None,
                config=self.config,
                default_dir=callback._driver_cwd,
                shared=o.strategy == "shared",
            )
            primary = PrimaryWriter(spec, warner=self._warner, rows=_rank_rows(o.rank_metrics, o.excludes))
            # main: no node writer at all (the target never learns any node).
            target = RunTarget(
                primary=primary,
                selection=o.nodes if o.strategy == "shared" else "workers",
                covered_node=self.node_id,  # the primary samples its own node
                storage=self._offline_storage(self.base_id),
            )
            self.session = RunSession(primary, self.fleet, target, o.finish_timeout_s)
            self.session.start()
        else:
            self.fleet.start()

    def _offline_storage(self, run_id: str) -> StorageSpot | None:
        return self._storage.for_run(run_id) if self._storage is not None else None

    def workers_placed(self, placements: list[Placement]) -> None:
        by_node: dict[str, list[int]] = {}
        for p in placements:
            by_node.setdefault(node_label(p.hostname, p.node_id), []).append(p.rank)
        if self.session is not None:
            if self.options.strategy == "shared":
                self.session.set_nodes({p.node_id for p in placements}, self.node_id)
            self.session.primary.update_config({"ray_train": {"world_size": len(placements), "ranks_by_node": by_node}})
            return
        for planned in plan_runs(self.options.strategy, placements, self.base_id):
            known = self.planned.get(planned.run_id)
            self.planned[planned.run_id] = planned
            if known is None:
                spec = run_spec(
                    self.options,
                    self._env,
                    mode=self.mode,
                    run_id=planned.run_id,
                    name=planned.name,
                    group=self.options.group or self.run_name,
                    label=planned.label,
                    config={**self.config, "ray_train": {**self.config["ray_train"], "rank": planned.rank}},
                    gpu_ids=planned.gpu_ids,
                    default_dir=self._driver_cwd,
                )
                target = RunTarget(
                    primary=None,
                    selection="workers",
                    nodes={planned.node_id},
                    standalone=spec,
                    excludes=self.options.excludes,
                    storage=self._offline_storage(planned.run_id),
                )
                self.fleet.add_run(target)
            elif known.node_id != planned.node_id:
                self.fleet.set_run_nodes(planned.run_id, {planned.node_id})

    def report(self, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if self.session is not None:
            # No copy on the controller's event loop: the writer thread builds its own row from
            # Ray's dicts and never changes them, and Ray hands a report's dicts to the report
            # callbacks after taking them off its queues, then drops them.
            payload = metrics[0] if self.options.rank_metrics == "rank0" else list(metrics)
            self.session.report(payload)
        else:
            for run_id, planned in self.planned.items():
                if planned.rank < len(metrics):
                    self.fleet.log(run_id, metrics[planned.rank])
        if checkpoint is not None and self.options.upload_checkpoints:
            self._log_checkpoint(checkpoint, metrics[0])

    def _log_checkpoint(self, checkpoint: Any, rank0: dict[str, Any]) -> None:
        aliases = ["latest"]
        if self._score_key:
            score = flatten(rank0).get(self._score_key)
            if isinstance(score, (int, float)) and not isinstance(score, bool):
                better = self._best is None or (score > self._best if self._score_max else score < self._best)
                if better:
                    self._best = float(score)
                    aliases.append("best")
        name = f"checkpoint-{self.base_id}"
        make = functools.partial(checkpoint_artifact, name=name, checkpoint=checkpoint)
        if self.session is not None:
            self.session.primary.log_artifact(make, aliases=aliases)
        else:
            rank0_run = next((r for r, p in self.planned.items() if p.rank == 0), None)
            if rank0_run is not None:
                self.fleet.log_artifact(rank0_run, checkpoint, name, aliases)

    def finish(self, exit_code: int, timeout: float) -> None:
        """Node writers first, then the primary (or each run of its own), then every actor."""
        wait = max(timeout, self.options.upload_timeout_s) if self.options.upload_checkpoints else timeout
        if self.session is not None:
            self.session.finish(exit_code, wait=True, timeout=wait)
        else:
            for run_id in self.planned:
                self.fleet.retire_run(run_id, wait, exit_code=exit_code)
        self.fleet.shutdown(wait)


def _rank_rows(mode: str, excludes: tuple[str, ...]) -> Any:
    def build(payload: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        metrics = payload if isinstance(payload, dict) else combine_ranks(payload, mode)
        row, skipped = to_row(metrics, excludes)
        return row, {}, skipped

    return build


def _gpu_ids(accelerator_ids: Any) -> tuple[int, ...]:
    try:
        return tuple(int(i) for i in (accelerator_ids or {}).get("GPU", []))
    except (TypeError, ValueError):
        return ()


def _publish(trial_id: str, placements: list[dict[str, Any]], warner: Warner) -> None:
    try:
        _handoff.publish_workers(trial_id, placements)
    except Exception as e:  # noqa: BLE001
        warner.warn("relay", f"could not tell the Tune callback where trial {trial_id}'s workers are ({describe(e)})")
