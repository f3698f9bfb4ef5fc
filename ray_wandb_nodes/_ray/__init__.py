"""Every touch of Ray's internals, in this one package (``core``, ``train``, ``tune``, ``failures``,
``range``); the rest of the package sees plain data.

Train V2's callback classes and contexts are DeveloperAPI and move between releases; Tune's
trial objects and a few core helpers are private. The plugin supports Ray 2.50 to 2.60 (CI runs
2.50, 2.55 and 2.60). Each name used and what for, by the first release that has it in the form
used here (read from the released sources):

- 2.47: ``ray.train.v2._internal.execution.callback`` (``ControllerCallback``,
  ``WorkerGroupCallback``, ``ReportCallback``): the adapter's bases;
  ``ray.train.v2._internal.constants.is_v2_enabled``: refusing Train V1 (V2 is opt-in on 2.50,
  the default from 2.51); ``WorkerGroup.get_workers()``, ``Worker.distributed_context.world_rank``,
  ``Worker.metadata`` (``.node_id``, ``.hostname``, ``.accelerator_ids``): where each rank runs;
  ``after_controller_state_update(previous_state, current_state)`` with
  ``controller.state.AbortedState``: an abort, the only sign of one up to 2.54; ``Result.error``.
- 2.48: ``after_controller_start(train_run_context)``; ``TrainRunContext.run_config``,
  ``.train_loop_config``, ``.scaling_config``: the run's identity and config.
- 2.49: the node label ``ray.io/node-id`` (``ray.io/node_id`` before) in
  ``placement_group(bundle_label_selector=)`` (2.47): a bundle pinned to its node.
- 2.50: ``after_report(training_report, metrics)`` (keywords; ``metrics=, checkpoint=`` before)
  and ``TrainingReport.checkpoint``; ``RunConfig.storage_context.experiment_fs_path`` and
  ``.storage_filesystem``: the offline storage route.
- 2.50 (read in 2.50.1, 2.55.1 and 2.60.0): ``Worker.metadata.pid`` (``ActorMetadata``): each
  rank's process, whose stdout and stderr Ray writes to ``<logs>/worker-<id>-<job>-<pid>.out|.err``;
  ``before_worker_group_shutdown(worker_group)``: an attempt's end, called on every shutdown of a
  started group (a restart, the end of training, a failure); ``Node.get_logs_dir_path()`` of
  ``ray._private.worker._global_node`` (or ``Worker.get_out_file_path()``): the node's ``logs``
  folder; ``WorkerGroupPollStatus.worker_statuses`` (``WorkerStatus.error``): a poll with a rank's
  error, on which the controller decides the attempt failed.
- 2.55: ``before_controller_abort()``: an abort, before the state update.
- 2.56: ``ReplicaGroupCallback.after_replica_group_start(replica_group)``: the workers of a
  replaced replica group (called only on a class that is also a ``WorkerGroupCallback``).
- 2.60: ``callbacks.nccl_ras`` (the NCCL hang detector): its logger, its ``HANG_DETECTOR_DIRNAME``.
- Long before 2.48 and unchanged since: ``Trial.temporary_state.ray_actor``, ``Trial.storage``,
  ``Trial.local_path``, ``Trial.experiment_dir_name``, ``ray.tune.get_context().get_trial_id()``
  (a trial's node, folder and group; a Train run inside a trial); ``ray._private.state.actors``
  and ``ActorHandle._actor_id`` (an actor's node, pid and state);
  ``RuntimeContext.was_current_actor_reconstructed`` (a restarted logger says so);
  ``ray.experimental.internal_kv`` (the Tune/Train handoff);
  ``ActorTableData.resource_mapping`` (a trial's GPU slots, read as ``get_gpu_ids`` reads them)
  through ``ray._private.state.state``: ``_connect_and_get_accessor()`` (2.58 to 2.60) or
  ``_check_connected()`` and ``global_state_accessor`` (2.50); ``PlacementGroup(PlacementGroupID())``
  (the janitor removes groups by id); ``ray._private.state.jobs()`` (``JobID``, ``IsDead``: the
  job's janitor ends with its job); ``ScalingConfig._resources_per_worker_not_none`` and
  ``ray._private.state.available_resources_per_node`` (how many nodes a job's workers need, for
  the loggers started ahead); ``ScalingConfig.max_workers``, read only where a release has it;
  ``Worker.execute_async`` (set-up on each train worker, calls run in order), a worker's
  ``TrainContext.execution_context.train_context_callbacks`` (its report hooks, 2.50 to 2.60) and
  ``TrainRunContext.backend_config.timeout_s`` (torch's process-group timeout).

Hooks that Ray changed and the plugin leaves alone: ``before_controller_shutdown`` (``async`` from
2.55). From 2.54 a raise in a controller hook can fail the run: every hook is guarded.
"""

from .core import (
    NODE_ID_LABEL,
    actor_state,
    current_actor_id,
    free_resources,
    job_ended,
    kv_del,
    kv_get,
    kv_put,
    list_nodes,
    logs_dir,
    pin_bundles_to_nodes,
    remove_placement_groups,
    was_restarted,
)
from .range import ray_version, train_v2_enabled, unsupported_ray
from .train import (
    NCCL_DETECTOR_DIR,
    NCCL_DETECTOR_LOGGER,
    Placement,
    TrainStart,
    add_report_hook,
    add_shutdown_hook,
    check_ray,
    finished_ranks,
    hook_group_shutdown,
    is_aborted,
    placements_of,
    poll_failed,
    queue_on_workers,
    report_checkpoint,
    result_failed,
    run_on_workers,
    train_callback_bases,
    train_start,
    training_thread_frames,
    worker_placements,
)
from .tune import (
    ActorPlace,
    actor_location,
    current_trial_id,
    trial_actor,
    trial_experiment,
    trial_local_path,
    trial_storage,
)

__all__ = [
    "NCCL_DETECTOR_DIR",
    "NCCL_DETECTOR_LOGGER",
    "NODE_ID_LABEL",
    "ActorPlace",
    "Placement",
    "TrainStart",
    "actor_location",
    "actor_state",
    "add_report_hook",
    "add_shutdown_hook",
    "check_ray",
    "core",
    "current_actor_id",
    "current_trial_id",
    "failures",
    "finished_ranks",
    "free_resources",
    "hook_group_shutdown",
    "is_aborted",
    "job_ended",
    "kv_del",
    "kv_get",
    "kv_put",
    "list_nodes",
    "logs_dir",
    "pin_bundles_to_nodes",
    "placements_of",
    "poll_failed",
    "queue_on_workers",
    "range",
    "ray_version",
    "remove_placement_groups",
    "report_checkpoint",
    "result_failed",
    "run_on_workers",
    "train",
    "train_callback_bases",
    "train_start",
    "train_v2_enabled",
    "training_thread_frames",
    "trial_actor",
    "trial_experiment",
    "trial_local_path",
    "trial_storage",
    "tune",
    "unsupported_ray",
    "was_restarted",
    "worker_placements",
]
