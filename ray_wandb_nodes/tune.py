"""``WandbNodesTuneCallback``: one W&B run per Tune trial, showing the nodes the trial uses.

A drop-in for Ray's ``WandbLoggerCallback`` (same names for what it has) whose runs hold
the system metrics of the trial's nodes instead of the driver's. Each trial's run is a
shared-mode run whose primary writer is a thread of the Tune driver: it logs the trial's
results against ``training_iteration`` and owns the run's state. The trial actor's node
(and, for a trial wrapping a ``TorchTrainer`` with ``WandbNodesCallback``, its train
workers' nodes) gets a writer in that node's ``NodeLogger``; one actor per node serves
every trial on it. Hooks hand work to background threads and never raise into Tune.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

from . import _handoff
from ._fleet import NodeFleet, RunTarget
from ._metrics import config_for_wandb
from ._nodes import NodeInfo
from ._options import _bad
from ._primary import PrimaryWriter
from ._secrets import capture_env
from ._session import RunSession
from ._setup import configure, default_base_url
from ._warn import Warner, describe, guarded
from ._writers import WriterSpec, node_spec, primary_spec
from .offline.storage import StorageSpot, storage_spot

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

DEFAULT_UPLOAD_TIMEOUT_S = 1800.0  # as Ray's WandbLoggerCallback (DEFAULT_SYNC_TIMEOUT)


class WandbNodesTuneCallback(Callback):  # type: ignore[misc]
    """One W&B run per Tune trial, with the system metrics of every node the trial uses.

    Add it to ``tune.RunConfig(callbacks=[WandbNodesTuneCallback(project="p")])``. Each
    trial's run has the trial id as id, the trial name as name, the experiment as group and
    the trial config as run config; results are logged against ``training_iteration``.

    The arguments Ray's ``WandbLoggerCallback`` has keep its names and meaning (``project``,
    ``group``, ``api_key_file``, ``api_key``, ``excludes``, ``log_config``,
    ``upload_checkpoints``, ``upload_timeout``, ``video_kwargs``, ``image_kwargs``,
    ``**wandb_init_kwargs``); ``entity``, ``tags``, ``notes``, ``mode``, ``nodes``,
    ``sampling_interval_s``, ``gpu_device_ids``, ``init_timeout_s``, ``finish_timeout_s`` and
    ``offline_transfer`` (through the experiment's storage) are as in
    :class:`~ray_wandb_nodes.WandbNodesCallback`. ``nodes="workers"`` (default) covers the
    nodes a trial uses; ``nodes="cluster"`` every alive node.
    """

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        upload_timeout: float = DEFAULT_UPLOAD_TIMEOUT_S,
        video_kwargs: dict[str, Any] | None = None,
        image_kwargs: dict[str, Any] | None = None,
        *,
        entity: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        mode: str | None = None,
        nodes: str = "workers",
        sampling_interval_s: float = 15.0,
        gpu_device_ids: list[int] | None = None,
        init_timeout_s: float = 90.0,
        finish_timeout_s: float = 60.0,
        offline_transfer: str = "auto",
        **wandb_init_kwargs: Any,
    ) -> None:
        for owned, why in (("id", "each trial's run id is its trial id"), ("name", "each run is named for its trial")):
            if owned in wandb_init_kwargs:
                raise _bad(owned, wandb_init_kwargs[owned], f"not accepted by the Tune callback: {why}")
        for option, value in (("video_kwargs", video_kwargs), ("image_kwargs", image_kwargs)):
            if value is not None and not isinstance(value, dict):
                raise _bad(option, value, "expected a dict of keyword arguments or None")
        self.options, self._env = configure(
            project=project,
            entity=entity,
            group=group,
            tags=tags,
            notes=notes,
            log_config=log_config,
            excludes=excludes,
            mode=mode,
            nodes=nodes,
            sampling_interval_s=sampling_interval_s,
            gpu_device_ids=gpu_device_ids,
            init_timeout_s=init_timeout_s,
            finish_timeout_s=finish_timeout_s,
            offline_transfer=offline_transfer,
            api_key=api_key,
            api_key_file=api_key_file,
            upload_checkpoints=upload_checkpoints,
            upload_timeout=upload_timeout,
            wandb_init_kwargs=wandb_init_kwargs,
        )
        self.video_kwargs = dict(video_kwargs or {})
        self.image_kwargs = dict(image_kwargs or {})
        self._api_key_file = api_key_file
        self._driver_cwd = os.getcwd()
        self._warner = Warner()
        self._run_ids: dict[str, str] = {}  # trial id -> W&B run id; kept across Tuner.restore
        self._sessions: dict[str, RunSession] = {}
        self._fleet: NodeFleet | None = None
        self._driver_node: NodeInfo | None = None

    @property
    def upload_checkpoints(self) -> bool:
        return self.options.upload_checkpoints

    @property
    def upload_timeout(self) -> float:
        return self.options.upload_timeout_s

    def __repr__(self) -> str:
        o = self.options
        return f"WandbNodesTuneCallback(project={o.project!r}, mode={o.mode!r}, nodes={o.nodes!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment folder (tuner.pkl): the key stays
        # out of it and is captured again where the experiment is restored.
        state = self.__dict__.copy()
        state.update(_sessions={}, _fleet=None, _driver_node=None, _env=replace(self._env, api_key=None))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._env.api_key is None and self.options.mode == "online":
            try:
                found = capture_env(os.environ, api_key_file=self._api_key_file, default_base_url=default_base_url())
            except ValueError as e:
                self._warner.warn("restore-key", f"no W&B API key after restore ({e})")
                return
            self._env = replace(self._env, api_key=found.api_key, api_key_source=found.api_key_source)

    def __deepcopy__(self, memo: dict[int, Any]) -> WandbNodesTuneCallback:
        # A copy in memory (Tune copies its run config) keeps the key; a pickle does not.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__.update(_sessions={}, _fleet=None, _driver_node=None, _run_ids=dict(self._run_ids))
        return clone

    # state across Tuner.restore --------------------------------------------------------------
    def get_state(self) -> dict[str, Any] | None:
        return {"run_ids": dict(self._run_ids)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._run_ids.update(state.get("run_ids") or {})

    def run_id(self, trial: Trial) -> str:
        """The W&B run id of ``trial`` (its trial id, or the one it had before a restore)."""
        return self._run_ids.setdefault(trial.trial_id, trial.trial_id)

    # trial lifecycle ---------------------------------------------------------------------------
    @guarded("on_trial_start")
    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._start(trial)

    @guarded("on_trial_restore")
    def on_trial_restore(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._start(trial)

    @guarded("on_trial_result")
    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        session = self._sessions.get(trial.trial_id) or self._start(trial)
        if session is None:
            return
        session.report(dict(result))
        path = result.get("checkpoint_path")  # a Train run inside the trial reported a checkpoint
        if self.upload_checkpoints and isinstance(path, str) and path:
            from ._artifacts import CheckpointAt

            storage = getattr(getattr(trial, "storage", None), "storage_filesystem", None)
            self._log_checkpoint(session, trial, CheckpointAt.from_result(path, storage))

    @guarded("on_checkpoint")
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        session = self._sessions.get(trial.trial_id)
        if self.upload_checkpoints and session is not None and checkpoint is not None:
            self._log_checkpoint(session, trial, checkpoint)

    def _log_checkpoint(self, session: RunSession, trial: Trial, checkpoint: Any) -> None:
        """One code path for ``on_checkpoint`` and results' ``checkpoint_path`` (named as Ray names it)."""
        from ._artifacts import checkpoint_artifact

        make = functools.partial(checkpoint_artifact, name=f"checkpoint_{trial}", checkpoint=checkpoint)
        session.primary.log_artifact(make, aliases=["latest"])

    @guarded("on_trial_complete")
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, exit_code=0)

    @guarded("on_trial_error")
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, exit_code=1)

    @guarded("on_experiment_end")
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Finish every run: node writers bounded by ``finish_timeout_s``, uploads by ``upload_timeout``."""
        for trial in trials:
            if trial.trial_id in self._sessions:
                self._end(trial, exit_code=1 if str(getattr(trial, "status", "")) == "ERROR" else 0)
        deadline = time.monotonic() + self.upload_timeout
        for session in list(self._sessions.values()):
            session.primary.wait_done(max(0.1, deadline - time.monotonic()))
        if self._fleet is not None:
            self._fleet.shutdown(self.options.finish_timeout_s)
            self._fleet = None
        self._sessions.clear()

    # internals -----------------------------------------------------------------------------------
    def _start(self, trial: Trial) -> RunSession | None:
        if self.options.mode == "disabled":
            return None
        session = self._sessions.get(trial.trial_id)
        actor = getattr(getattr(trial, "temporary_state", None), "ray_actor", None)
        if session is not None and not session.finishing:
            # A restarted trial: its actor may sit on another node now.
            if session.primary.ready:
                self._locate_later(session, actor)
            return session
        if self._fleet is None:
            import ray

            self._driver_node = NodeInfo(ray.get_runtime_context().get_node_id(), socket.gethostname(), "")
            self._fleet = NodeFleet(init_timeout_s=self.options.init_timeout_s, warner=self._warner)
        run_id = self.run_id(trial)
        try:
            _handoff.mark_trial(trial.trial_id, run_id)  # before the trial's function runs
        except Exception as e:  # noqa: BLE001
            self._warner.warn("handoff", f"Train runs inside trials cannot join their trial's run ({describe(e)})")
        session = self._new_session(trial, run_id, actor)
        self._sessions[trial.trial_id] = session
        session.start()
        return session

    def _new_session(self, trial: Trial, run_id: str, actor: Any) -> RunSession:
        assert self._fleet is not None and self._driver_node is not None
        config = {k: v for k, v in dict(trial.config).items() if k not in self.options.excludes and k != "callbacks"}
        local_path = getattr(trial, "local_path", None)
        spec = primary_spec(
            self.options,
            self._env,
            mode=self.options.mode or "online",
            run_id=run_id,
            label=self._driver_node.label,
            display_name=str(trial),
            group=getattr(trial, "experiment_dir_name", None),
            config=config_for_wandb(config, self._warner.warn),
            default_dir=local_path if local_path and os.path.isdir(local_path) else self._driver_cwd,
        )
        trial_id = trial.trial_id
        location: dict[str, Any] = {}  # the trial's node and pid, once found
        holder: dict[str, RunTarget] = {}
        primary = PrimaryWriter(
            spec,
            warner=self._warner,
            rows=self._rows,
            prepare=functools.partial(self._place, holder=holder, actor=actor, location=location),
        )
        storage: StorageSpot | None = None
        why_not: str | None = None
        if spec.offline_dir is not None:  # offline: the node writers' runs come to the driver
            trial_storage = getattr(trial, "storage", None)
            experiment, why_not = storage_spot(
                self.options.offline_transfer,
                getattr(trial_storage, "experiment_fs_path", None),
                getattr(trial_storage, "storage_filesystem", None),
            )
            storage = experiment.for_run(run_id) if experiment is not None else None
        if why_not is not None:
            self._warner.warn("offline-storage", f"offline runs come through Ray: {why_not}")
        target = RunTarget(
            primary=primary,
            selection=self.options.nodes,
            extra_nodes=(lambda: _handoff.worker_nodes(trial_id)) if self.options.nodes == "workers" else None,
            spec_for=functools.partial(_node_writer_spec, location=location),
            storage=storage,
        )
        holder["target"] = target
        return RunSession(primary, self._fleet, target, self.options.finish_timeout_s)

    def _rows(self, result: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        import wandb

        from ._tune_rows import tune_rows

        return tune_rows(
            result,
            excludes=self.options.excludes,
            log_config=self.options.log_config,
            wandb=wandb,
            image_kwargs=self.image_kwargs,
            video_kwargs=self.video_kwargs,
        )

    def _place(
        self, spec: WriterSpec, *, holder: dict[str, RunTarget], actor: Any, location: dict[str, Any]
    ) -> WriterSpec:
        """On the writer thread, before the run exists: find the trial's node and pid.

        The primary samples system metrics only when the trial runs on the driver's node
        (then of the trial's process); otherwise the trial's node gets a node writer and the
        primary samples nothing, so the run shows the nodes the trial used and no other.
        """
        assert self._driver_node is not None
        target = holder["target"]
        found = _locate(actor, timeout=self.options.init_timeout_s)
        settings = dict(spec.settings)
        if found is None:
            settings["x_disable_stats"] = True
            self._warner.warn("locate", "could not find a trial's node; its run may lack that node's system metrics")
            return _with_settings(spec, settings)
        node_id, pid = found
        location.update(node_id=node_id, pid=pid)
        target.nodes = {node_id}
        if node_id == self._driver_node.node_id:
            target.covered_node = node_id
            settings["x_stats_pid"] = pid
        else:
            target.covered_node = None
            settings["x_disable_stats"] = True
        return _with_settings(spec, settings)

    def _locate_later(self, session: RunSession, actor: Any) -> None:
        import threading

        def work() -> None:
            found = _locate(actor, timeout=self.options.init_timeout_s)
            if found is None:
                return
            node_id = found[0]
            covered = session.target.covered_node
            session.set_nodes({node_id}, covered if covered == node_id else None)

        threading.Thread(target=work, daemon=True).start()

    def _end(self, trial: Trial, exit_code: int) -> None:
        session = self._sessions.get(trial.trial_id)
        if session is not None:
            session.finish(exit_code, wait=False)
        try:
            _handoff.clear_trial(trial.trial_id)
        except Exception:  # noqa: BLE001
            pass


def _with_settings(spec: WriterSpec, settings: dict[str, Any]) -> WriterSpec:
    return replace(spec, settings=settings)


def _node_writer_spec(primary: PrimaryWriter, node: NodeInfo, *, location: dict[str, Any]) -> WriterSpec:
    spec = node_spec(primary.spec, label=node.label, entity=primary.entity, project=primary.project)
    settings = {k: v for k, v in spec.settings.items() if k not in ("x_disable_stats", "x_stats_pid")}
    if location.get("node_id") == node.node_id and location.get("pid"):
        settings["x_stats_pid"] = location["pid"]  # proc.* series describe the trial's process
    return _with_settings(spec, settings)


def _locate(actor: Any, timeout: float) -> tuple[str, int] | None:
    """(node id, pid) of a trial actor once it is alive, from the GCS actor table."""
    if actor is None:
        return None
    import ray._private.state as state

    actor_id = actor._actor_id.hex()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = state.actors(actor_id=actor_id)
        if info and info.get("State") == "ALIVE" and info.get("Address", {}).get("NodeID"):
            return str(info["Address"]["NodeID"]), int(info.get("Pid") or 0)
        if info and info.get("State") == "DEAD":
            return None
        time.sleep(0.2)
    return None
