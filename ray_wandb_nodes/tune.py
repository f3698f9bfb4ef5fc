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

import os
from typing import TYPE_CHECKING, Any, Literal

from ray.tune import Callback

from . import _ray
from ._config.setup import configure, key_recaptured, without_key
from ._config.values import Mode
from ._run.session import SharedSession
from ._run.tune_run import TuneRuns
from ._warn import Warner, guarded

if TYPE_CHECKING:
    from ray.tune.experiment import Trial


class WandbNodesTuneCallback(Callback):  # type: ignore[misc]
    """One W&B run per Tune trial, with the system metrics of every node the trial uses.

    Add it to ``tune.RunConfig(callbacks=[WandbNodesTuneCallback(project="p")])``. Each
    trial's run has the trial id as id, the trial name as name, the experiment as group and
    the trial config as run config; results are logged against ``training_iteration``.

    The arguments Ray's ``WandbLoggerCallback`` has keep its names, order and meaning; the
    others are as in :class:`~ray_wandb_nodes.WandbNodesCallback`, for a trial's nodes: each
    trial's run holds the ``nodes`` table of its nodes, and the straggler rule compares them by
    system metrics (a trial reports as one process, so there are no ranks to compare by a metric).
    ``offline_transfer="storage"`` goes through the experiment's storage.

    Args:
        project: the W&B project; None: ``WANDB_PROJECT``, else wandb's default project
        group: the W&B group; None: the Ray run name (Train's ``node`` and ``all`` strategies) or the experiment
            (Tune)
        api_key_file: a file holding the W&B API key (give this or ``api_key``, not both)
        api_key: the W&B API key; None: ``WANDB_API_KEY``, then the netrc entry; it reaches every node inside
            the callback, never through ``runtime_env`` or the run config
        excludes: metric keys not to log: a key, or a prefix of nested keys (``opt`` drops ``opt/lr``)
        log_config: log the config: the train loop config into the run config (Train), each result's ``config``
            (Tune)
        upload_checkpoints: log each reported checkpoint as an artifact (local folders uploaded, remote ones
            referenced), aliased ``latest`` (and ``best`` in Train)
        upload_timeout: how long a run's end waits for checkpoint uploads (an abort does not wait for them)
        video_kwargs: keyword arguments of ``wandb.Video`` for video arrays in results (``format`` defaults to
            ``gif``)
        image_kwargs: keyword arguments of ``wandb.Image`` for image arrays in results
        entity: the W&B entity (team or user); None: ``WANDB_ENTITY``, else your default entity
        tags: the run's W&B tags
        notes: the run's W&B notes
        mode: ``online``, ``offline`` or ``disabled``; None: ``WANDB_MODE`` (``WANDB_DISABLED=true``: disabled),
            else ``online``
        nodes: ``workers``: the nodes hosting train workers (Train) or a trial (Tune); ``cluster``: every alive
            node, new ones included
        sampling_interval_s: the system-metric sampling interval on every node
        gpu_device_ids: the GPU indices to sample on every node; None: all
        straggler_threshold: a node is a straggler once its value stays worse than this fraction of the other
            nodes' median (``min``: above the median / threshold)
        straggler_window_s: for how long (and at least 3 samples) before a node counts as a straggler, or as
            recovered
        alerts: W&B alerts when a node becomes a straggler, recovers or is lost (the ``nodes`` table, the
            warnings and ``nodes/stragglers`` stay without)
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
        **wandb_init_kwargs: passed on to the primary's ``wandb.init`` (``job_type``, ``resume``, ``dir``, ...);
            ``settings`` (a dict or ``wandb.Settings``) applies to every writer, less the fields that decide
            each writer's role
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
        upload_timeout: float = 1800.0,
        video_kwargs: dict[str, Any] | None = None,
        image_kwargs: dict[str, Any] | None = None,
        *,
        entity: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        mode: Literal["online", "offline", "disabled"] | None = None,
        nodes: Literal["workers", "cluster"] = "workers",
        sampling_interval_s: float = 15.0,
        gpu_device_ids: list[int] | None = None,
        straggler_threshold: float = 0.7,
        straggler_window_s: float = 120.0,
        alerts: bool = True,
        init_timeout_s: float = 90.0,
        finish_timeout_s: float = 60.0,
        max_node_writers: int = 256,
        offline_transfer: Literal["auto", "ray", "storage"] = "auto",
        egress: Literal["direct", "relay"] = "direct",
        egress_hosts: list[str] | None = None,
        **wandb_init_kwargs: Any,
    ) -> None:
        _ray.check_ray(train=False)
        self.options, self._env = configure("tune", locals())  # the arguments above, by the table
        self.video_kwargs = dict(self.options.video_kwargs)
        self.image_kwargs = dict(self.options.image_kwargs)
        self._api_key_file = api_key_file
        self._driver_cwd = os.getcwd()
        self._warner = Warner()
        self._run_ids: dict[str, str] = {}  # trial id -> W&B run id; kept across Tuner.restore
        self._runs: TuneRuns | None = None  # the experiment's runs, from its first trial on

    @property
    def upload_checkpoints(self) -> bool:
        return self.options.upload_checkpoints

    @property
    def upload_timeout(self) -> float:
        return self.options.upload_timeout

    def __repr__(self) -> str:
        o = self.options
        return f"WandbNodesTuneCallback(project={o.project!r}, mode={o.mode.value!r}, nodes={o.nodes.value!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment folder (tuner.pkl): the key stays
        # out of it and is captured again where the experiment is restored.
        state = self.__dict__.copy()
        state.update(_runs=None, _env=without_key(self._env))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_runs", None)
        if self._env.api_key is None and self.options.mode is Mode.ONLINE:
            try:
                self._env = key_recaptured(self._env, self._api_key_file)
            except ValueError as e:
                self._warner.warn("restore-key", f"no W&B API key after restore ({e})")

    def __deepcopy__(self, memo: dict[int, Any]) -> WandbNodesTuneCallback:
        # A copy in memory (Tune copies its run config) keeps the key; a pickle does not.
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.__dict__.update(_runs=None, _run_ids=dict(self._run_ids))
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
        session = self._session(trial) or self._start(trial)
        if session is None:
            return
        if self._runs is not None:
            self._runs.reported(trial.trial_id)  # after a retry: its first result says it recovered
        session.report(dict(result))
        path = result.get("checkpoint_path")  # a Train run inside the trial reported a checkpoint
        if self.upload_checkpoints and isinstance(path, str) and path:
            from ._wandb.artifacts import CheckpointAt

            _, storage = _ray.trial_storage(trial)
            self._log_checkpoint(session, trial, CheckpointAt.from_result(path, storage))

    @guarded("on_checkpoint")
    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any) -> None:
        session = self._session(trial)
        if self.upload_checkpoints and session is not None and checkpoint is not None:
            self._log_checkpoint(session, trial, checkpoint)

    def _log_checkpoint(self, session: SharedSession, trial: Trial, checkpoint: Any) -> None:
        """One code path for ``on_checkpoint`` and results' ``checkpoint_path`` (named as Ray names it)."""
        session.log_checkpoint(checkpoint, f"checkpoint_{trial}", ["latest"])

    @guarded("on_trial_complete")
    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self._end(trial, exit_code=0)

    @guarded("on_trial_recover")
    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """The trial failed and Tune retries it (its ``FailureConfig``): the failure named in its run."""
        if self._runs is not None:
            self._runs.trial_failed(trial, retrying=True)

    @guarded("on_trial_error")
    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        if self._runs is not None:
            self._runs.trial_failed(trial, retrying=False)  # named in its run before the run ends
        self._end(trial, exit_code=1)

    @guarded("on_experiment_end")
    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Finish every run: node writers bounded by ``finish_timeout_s``, uploads by ``upload_timeout``."""
        runs, self._runs = self._runs, None
        if runs is None:
            return
        for trial in trials:  # a trial whose end Tune did not report (its runs already ending are left be)
            runs.end(trial.trial_id, exit_code=1 if str(getattr(trial, "status", "")) == "ERROR" else 0)
        runs.end_all(self.upload_timeout)

    # internals -----------------------------------------------------------------------------------
    def _start(self, trial: Trial) -> SharedSession | None:
        if not self.options.mode.logs:
            return None
        if self._runs is None:
            self._runs = TuneRuns(self.options, self._env, self._warner, driver_cwd=self._driver_cwd, rows=self._rows)
        return self._runs.start(trial, self.run_id(trial))

    def _session(self, trial: Trial) -> SharedSession | None:
        return self._runs.sessions.get(trial.trial_id) if self._runs is not None else None

    def _rows(self, result: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        import wandb

        from ._run.tune_rows import tune_rows

        return tune_rows(
            result,
            excludes=self.options.excludes,
            log_config=self.options.log_config,
            wandb=wandb,
            image_kwargs=self.image_kwargs,
            video_kwargs=self.video_kwargs,
        )

    def _end(self, trial: Trial, exit_code: int) -> None:
        # Returns at once: the run ends on the fleet's and its writer's threads, and the
        # trial's mark is cleared on a thread of its own (the next trial's start waits for neither).
        if self._runs is not None:
            self._runs.end(trial.trial_id, exit_code)
