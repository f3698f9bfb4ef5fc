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

import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from . import _handoff
from ._metrics import jsonable
from ._naming import node_label
from ._options import Options, build_options
from ._secrets import CapturedEnv, capture_env
from ._session import RankPlacement, RunSession
from ._warn import Warner, describe, guarded

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


def _wandb_init_params() -> list[str] | None:
    try:
        import inspect

        import wandb
    except ImportError:
        return None
    return list(inspect.signature(wandb.init).parameters)


def _default_base_url() -> str | None:
    try:
        from wandb.sdk.lib.urls import DEFAULT_BASE_URL
    except ImportError:
        return None
    return str(DEFAULT_BASE_URL)


class WandbNodesCallback(ControllerCallback, WorkerGroupCallback, ReportCallback):  # type: ignore[misc]
    """One W&B run that shows every node of a Ray Train run.

    Add it to ``ray.train.RunConfig(callbacks=[WandbNodesCallback(project="my-proj")])``.
    The Train controller becomes the run's primary writer (rank 0's reports, config, final
    state); every other node hosting train workers gets a ``NodeLogger`` actor that joins the
    same run in W&B shared mode, so each node's GPU, CPU, memory, disk and network metrics
    appear in the run, labelled ``node-<hostname>-<node id>``.

    Args:
        project, entity, group, name, tags, notes: as in ``wandb.init``. ``project`` and
            ``entity`` default to ``WANDB_PROJECT``/``WANDB_ENTITY``; ``name`` to the Ray
            run name.
        config: extra run config, merged over the train loop config.
        log_config: put ``train_loop_config`` into the run config (default True).
        excludes: metric keys not to log (exact, or a ``/`` prefix of nested keys).
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; default ``WANDB_MODE``, else online.
        nodes: ``"workers"`` (nodes hosting train workers, default) or ``"cluster"`` (every
            alive node).
        sampling_interval_s: system-metric sampling interval (default 15 s, at least 0.1).
        gpu_device_ids: GPU indices to sample on every node (default all).
        init_timeout_s, finish_timeout_s: bounds on joining and finishing the run.
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
        sampling_interval_s: float = 15.0,
        gpu_device_ids: list[int] | None = None,
        init_timeout_s: float = 90.0,
        finish_timeout_s: float = 60.0,
        api_key: str | None = None,
        api_key_file: str | None = None,
        **wandb_init_kwargs: Any,
    ) -> None:
        from ray.train.v2._internal.constants import is_v2_enabled

        if not is_v2_enabled():
            raise RuntimeError(
                "ray_wandb_nodes.WandbNodesCallback needs Ray Train V2, but RAY_TRAIN_V2_ENABLED=0 "
                "is set; unset it (V2 is the default since Ray 2.51)"
            )
        options = build_options(
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
            env_mode=os.environ.get("WANDB_MODE") or ("disabled" if _env_true("WANDB_DISABLED") else None),
            nodes=nodes,
            sampling_interval_s=sampling_interval_s,
            gpu_device_ids=gpu_device_ids,
            init_timeout_s=init_timeout_s,
            finish_timeout_s=finish_timeout_s,
            api_key=api_key,
            api_key_file=api_key_file,
            wandb_init_kwargs=wandb_init_kwargs,
            init_params=_wandb_init_params(),
        )
        if options.mode != "disabled" and _wandb_init_params() is None:
            raise ImportError("ray_wandb_nodes needs wandb to log (pip install 'wandb>=0.28'), or pass mode='disabled'")
        self.options: Options = options
        self._env: CapturedEnv = capture_env(
            os.environ, api_key=api_key, api_key_file=api_key_file, default_base_url=_default_base_url()
        )
        self._driver_cwd = os.getcwd()
        self._warner = Warner()
        self._session: RunSession | None = None
        # Built inside a Tune trial: maybe that trial's W&B run is the run (see _handoff).
        self._tune_trial_id = _handoff.current_trial_id() if options.mode != "disabled" else None
        self._relay_trial: str | None = None

    def __repr__(self) -> str:
        o = self.options
        return f"WandbNodesCallback(project={o.project!r}, mode={o.mode!r}, nodes={o.nodes!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_session"] = None  # runtime state never travels
        state["_relay_trial"] = None
        return state

    @property
    def run_id(self) -> str | None:
        """The W&B run id, once the run has started (on the Train controller)."""
        return self._session.run_id if self._session else None

    # ControllerCallback --------------------------------------------------------------------
    @guarded("after_controller_start")
    def after_controller_start(self, train_run_context: TrainRunContext) -> None:
        if self.options.mode == "disabled" or self._session is not None or self._relay_trial:
            return
        if self._tune_trial_id and _handoff.trial_mark(self._tune_trial_id):
            # Inside a trial that WandbNodesTuneCallback logs: the trial's run is the run;
            # this callback only tells it where the train workers are.
            self._relay_trial = self._tune_trial_id
            return
        import ray

        from ._fleet import NodeFleet, RunTarget
        from ._naming import train_run_id
        from ._nodes import NodeInfo
        from ._primary import PrimaryWriter, train_rows
        from ._writers import primary_spec

        run_config = train_run_context.run_config
        config: dict[str, Any] = {}
        if self.options.log_config and train_run_context.train_loop_config:
            config.update(train_run_context.train_loop_config)
        config.update(self.options.config)
        scaling = train_run_context.scaling_config
        config["ray_train"] = {
            "run_name": run_config.name,
            "num_workers": getattr(scaling, "num_workers", None),
            "use_gpu": getattr(scaling, "use_gpu", None),
        }
        node_id = ray.get_runtime_context().get_node_id()
        spec = primary_spec(
            self.options,
            self._env,
            mode=self.options.mode or "online",
            run_id=train_run_id(str(run_config.storage_path), str(run_config.name)),
            label=NodeInfo(node_id=node_id, hostname=socket.gethostname(), ip="").label,
            display_name=run_config.name,
            group=None,
            config=jsonable(config),
            default_dir=self._driver_cwd,
        )
        primary = PrimaryWriter(spec, warner=self._warner, rows=train_rows(self.options.excludes))
        fleet = NodeFleet(init_timeout_s=self.options.init_timeout_s, warner=self._warner)
        target = RunTarget(primary=primary, selection=self.options.nodes, covered_node=node_id)
        self._session = RunSession(primary, fleet, target, self.options.finish_timeout_s)
        self._session.start()

    @guarded("after_controller_finish")
    def after_controller_finish(self, result: Result) -> None:
        if self._session is not None:
            self._session.finish(exit_code=1 if result.error is not None else 0, wait=True)
            self._session.fleet.shutdown(self.options.finish_timeout_s)

    @guarded("before_controller_abort")
    def before_controller_abort(self) -> None:
        # The controller exits right after this hook: finish fast, as failed.
        if self._session is not None:
            timeout = min(10.0, self.options.finish_timeout_s)
            self._session.finish(exit_code=1, wait=True, timeout=timeout)
            self._session.fleet.shutdown(timeout)

    # WorkerGroupCallback ---------------------------------------------------------------------
    @guarded("after_worker_group_start")
    def after_worker_group_start(self, worker_group: WorkerGroup) -> None:
        if self._session is None and not self._relay_trial:
            return
        placements = [
            RankPlacement(
                rank=w.distributed_context.world_rank if w.distributed_context else i,
                node_id=w.metadata.node_id,
                hostname=w.metadata.hostname,
            )
            for i, w in enumerate(worker_group.get_workers())
        ]
        if self._relay_trial:
            trial_id = self._relay_trial
            published = [{"node_id": p.node_id, "hostname": p.hostname, "rank": p.rank} for p in placements]
            # A GCS write: off the controller's event loop like everything else.
            threading.Thread(target=_publish, args=(trial_id, published, self._warner), daemon=True).start()
            return
        assert self._session is not None
        self._session.set_nodes({p.node_id for p in placements}, self._session.target.covered_node)
        nodes: dict[str, list[int]] = {}
        for p in placements:
            nodes.setdefault(node_label(p.hostname, p.node_id), []).append(p.rank)
        self._session.primary.update_config({"ray_train": {"world_size": len(placements), "ranks_by_node": nodes}})

    # ReportCallback --------------------------------------------------------------------------
    @guarded("after_report")
    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        if self._session is not None and metrics:
            self._session.report(metrics[0])


def _publish(trial_id: str, placements: list[dict[str, Any]], warner: Warner) -> None:
    try:
        _handoff.publish_workers(trial_id, placements)
    except Exception as e:  # noqa: BLE001
        warner.warn("relay", f"could not tell the Tune callback where trial {trial_id}'s workers are ({describe(e)})")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")
