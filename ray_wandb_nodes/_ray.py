"""Every touch of Ray's internals, in one place; the rest of the package sees plain data.

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
  (the janitor removes groups by id); ``ScalingConfig._resources_per_worker_not_none`` and
  ``ray._private.state.available_resources_per_node`` (how many nodes a job's workers need, for
  the loggers started ahead); ``ScalingConfig.max_workers``, read only where a release has it;
  ``Worker.execute_async`` (set-up on each train worker, calls run in order), a worker's
  ``TrainContext.execution_context.train_context_callbacks`` (its report hooks, 2.50 to 2.60) and
  ``TrainRunContext.backend_config.timeout_s`` (torch's process-group timeout).

Hooks that Ray changed and the plugin leaves alone: ``before_controller_shutdown`` (``async`` from
2.55). From 2.54 a raise in a controller hook can fail the run: every hook is guarded.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._gpu_ids import gpu_slots, ray_gpu_ids
from ._ray_range import unsupported_ray
from ._strategies import Placement

NODE_ID_LABEL = "ray.io/node-id"
# The NCCL hang detector's logger on the controller, its folder under the experiment (2.60).
NCCL_DETECTOR_LOGGER, NCCL_DETECTOR_DIR = "ray.train.v2._internal.callbacks.nccl_ras", "hang_detector"


def train_callback_bases() -> tuple[type, ...]:
    """The Train V2 callback classes the adapter subclasses: controller, worker group, report, and
    (from 2.56) replica group; ``(object,)`` when this Ray has none of them (the adapter then
    refuses to be built, saying why)."""
    try:
        from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerGroupCallback
    except ImportError:
        return (object,)
    bases: list[type] = [ControllerCallback, WorkerGroupCallback, ReportCallback]
    try:  # 2.56+: called for a replaced replica group, and only on WorkerGroupCallbacks
        from ray.train.v2._internal.execution.callback import ReplicaGroupCallback

        bases.append(ReplicaGroupCallback)
    except ImportError:
        pass
    return tuple(bases)


def train_v2_enabled() -> bool:
    from ray.train.v2._internal.constants import is_v2_enabled

    return bool(is_v2_enabled())


def check_ray(*, train: bool) -> None:
    """Raise ``RuntimeError`` saying why when the installed Ray cannot serve the plugin."""
    version = ray_version()
    enabled = train_v2_enabled() if train and version is not None and train_callback_bases() != (object,) else None
    problem = unsupported_ray(version, train=train, v2_enabled=enabled)
    if problem is not None:
        raise RuntimeError(f"ray_wandb_nodes: {problem}")


def ray_version() -> str | None:
    """The installed Ray's version, None without Ray."""
    try:
        import ray
    except ImportError:
        return None
    return str(ray.__version__)


# Ray Train -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainStart:
    """What the Train adapter needs of a ``TrainRunContext``, as plain data."""

    run_name: str
    storage_path: str
    train_loop_config: Any  # a mapping, or None
    num_workers: Any
    use_gpu: Any
    experiment_fs_path: Any  # the run's storage as the controller resolved it (None: unknown)
    storage_filesystem: Any
    score_attribute: str | None  # CheckpointConfig.checkpoint_score_attribute
    score_order: str  # "max" or "min"
    # What one worker asks (ScalingConfig's resources per worker, GPU included with use_gpu);
    # None when unknown. An elastic run's most workers (max_workers) where num_workers is not set.
    resources_per_worker: dict[str, float] | None = None
    max_workers: int | None = None
    pg_timeout_s: float | None = None


def train_start(ctx: Any) -> TrainStart:
    run_config = ctx.run_config
    storage = getattr(run_config, "storage_context", None)
    scaling = ctx.scaling_config
    checkpointing = run_config.checkpoint_config
    return TrainStart(
        run_name=str(run_config.name),
        storage_path=str(run_config.storage_path),
        train_loop_config=ctx.train_loop_config,
        num_workers=getattr(scaling, "num_workers", None),
        use_gpu=getattr(scaling, "use_gpu", None),
        experiment_fs_path=getattr(storage, "experiment_fs_path", None),
        storage_filesystem=getattr(storage, "storage_filesystem", None),
        score_attribute=getattr(checkpointing, "checkpoint_score_attribute", None),
        score_order=getattr(checkpointing, "checkpoint_score_order", "max"),
        resources_per_worker=_per_worker(scaling),
        max_workers=_int_or_none(getattr(scaling, "max_workers", None)),
        pg_timeout_s=_seconds(getattr(getattr(ctx, "backend_config", None), "timeout_s", None)),
    )


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _per_worker(scaling: Any) -> dict[str, float] | None:
    """``ScalingConfig._resources_per_worker_not_none`` (Ray 2.50 to 2.60): the resources one
    worker asks, with Train's defaults (1 CPU, or 1 GPU with use_gpu) filled in."""
    try:
        resources = scaling._resources_per_worker_not_none
        return {str(k): float(v) for k, v in dict(resources).items()}
    except Exception:  # noqa: BLE001 - another shape: the caller falls back to Train's defaults
        return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def free_resources() -> dict[str, dict[str, float]]:
    """Each alive node's free resources (one GCS call); empty when it cannot be read."""
    try:
        from ray._private import state

        free = state.available_resources_per_node()
        return {str(n): {str(k): float(v) for k, v in r.items()} for n, r in free.items()}
    except Exception:  # noqa: BLE001 - the caller falls back to each node's totals
        return {}


def worker_placements(worker_group: Any) -> list[Placement]:
    """Where each train worker of a started worker group runs."""
    return placements_of(worker_group.get_workers())


def placements_of(workers: Any) -> list[Placement]:
    """Where each of a list of Train ``Worker`` objects runs (``metadata``, ``distributed_context``:
    Ray 2.50 to 2.60; the list ``before_init_train_context`` gets, before the train context)."""
    return [
        Placement(
            rank=w.distributed_context.world_rank if w.distributed_context else i,
            node_id=w.metadata.node_id,
            hostname=w.metadata.hostname,
            gpu_ids=ray_gpu_ids(w.metadata.accelerator_ids),
        )
        for i, w in enumerate(workers)
    ]


def run_on_workers(worker_group: Any, fn: Any, *args: Any, timeout: float) -> list[Any] | None:
    """``fn(rank, *args)`` on every train worker: what each returned, None if not all in ``timeout``."""
    import ray

    refs = queue_on_workers(worker_group.get_workers(), fn, *args)
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if len(ready) < len(refs):
        ray.get(ready)  # a raise in fn surfaces here
        return None
    return list(ray.get(refs))


def is_aborted(state: Any) -> bool:
    """Whether a controller state is Train's aborted state (an abort's only sign up to 2.54)."""
    try:
        from ray.train.v2._internal.execution.controller.state import AbortedState
    except ImportError:
        return False
    return isinstance(state, AbortedState)


def report_checkpoint(training_report: Any) -> Any:  # ``TrainingReport.checkpoint``
    return getattr(training_report, "checkpoint", None)


def result_failed(result: Any) -> bool:
    return getattr(result, "error", None) is not None


def finished_ranks(poll_status: Any) -> frozenset[int]:
    """The ranks whose train function returned: ``WorkerStatus`` (2.50-2.60) not ``running``, no ``error``."""
    return frozenset(int(r) for r, s in poll_status.worker_statuses.items() if not s.running and s.error is None)


# Ray Tune --------------------------------------------------------------------------------------------
def current_trial_id() -> str | None:
    """The id of the Tune trial this process runs in, or None outside Tune."""
    try:
        from ray import tune

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # outside a trial Ray warns and returns None
            trial_id = tune.get_context().get_trial_id()
    except Exception:  # noqa: BLE001 - not in a trial, or Tune not importable
        return None
    return str(trial_id) if trial_id else None


def trial_actor(trial: Any) -> Any:
    """The trial's actor handle while it runs (None before it is scheduled)."""
    return getattr(getattr(trial, "temporary_state", None), "ray_actor", None)


def trial_storage(trial: Any) -> tuple[Any, Any]:
    """(experiment path in its filesystem, the filesystem) of the trial's storage."""
    storage = getattr(trial, "storage", None)
    return getattr(storage, "experiment_fs_path", None), getattr(storage, "storage_filesystem", None)


def trial_local_path(trial: Any) -> str | None:
    return getattr(trial, "local_path", None)


def trial_experiment(trial: Any) -> str | None:
    return getattr(trial, "experiment_dir_name", None)


class ActorPlace(NamedTuple):
    """Where an alive actor runs: its node, its pid, and its GPU slots there (None: unreadable)."""

    node_id: str
    pid: int
    gpu_slots: tuple[int, ...] | None


def actor_location(actor: Any, timeout: float) -> ActorPlace | None:
    """Where an actor runs once alive, from the GCS actor table, GPU slots included (None: never alive)."""
    if actor is None:
        return None
    actor_id = actor._actor_id.hex()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = actor_state(actor_id)
        if info and info.get("State") == "ALIVE" and info.get("Address", {}).get("NodeID"):
            return ActorPlace(str(info["Address"]["NodeID"]), int(info.get("Pid") or 0), _gpu_slots(actor._actor_id))
        if info and info.get("State") == "DEAD":
            return None
        time.sleep(0.2)
    return None


def _gpu_slots(actor_id: Any) -> tuple[int, ...] | None:
    try:
        import ray._private.state as state
        from ray.core.generated import gcs_pb2

        gcs = state.state  # 2.58 to 2.60: _connect_and_get_accessor(); 2.50: _check_connected() (returns None)
        get = gcs._connect_and_get_accessor if hasattr(gcs, "_connect_and_get_accessor") else gcs._check_connected
        raw = (get() or gcs.global_state_accessor).get_actor_info(actor_id)
        mapping = gcs_pb2.ActorTableData.FromString(raw).resource_mapping if raw else None
        return None if mapping is None else gpu_slots((m.name, [r.index for r in m.resource_ids]) for m in mapping)
    except Exception:  # noqa: BLE001 - another shape: the trial's node is judged by all its GPUs
        return None


# Ray core --------------------------------------------------------------------------------------------
def actor_state(actor_id: str) -> dict[str, Any] | None:
    """The GCS actor table's entry of ``actor_id`` (None when unknown)."""
    import ray._private.state as state

    info = state.actors(actor_id=actor_id)
    return dict(info) if info else None


def list_nodes() -> list[dict[str, Any]]:
    import ray

    return list(ray.nodes())


def current_actor_id() -> str | None:
    """The id of the actor this code runs in (None in a driver, or where Ray is not started: asking
    would start a local Ray instance from a logging thread)."""
    import ray

    if not ray.is_initialized():
        return None
    actor_id = ray.get_runtime_context().get_actor_id()
    return str(actor_id) if actor_id else None


def was_restarted() -> bool:
    """Whether Ray restarted the current actor (its process died and this is a new one)."""
    try:
        import ray

        if not ray.is_initialized():  # a plain object (tests): asking would start Ray
            return False
        context = ray.get_runtime_context()
        if context.get_actor_id() is None:
            return False
        with warnings.catch_warnings():  # Ray's property reads its own deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            return bool(context.was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - the GCS did not answer
        return False


def pin_bundles_to_nodes(node_ids: list[str]) -> dict[str, Any]:
    """``placement_group`` keyword arguments that pin bundle ``i`` to node ``node_ids[i]``."""
    return {"bundle_label_selector": [{NODE_ID_LABEL: node_id} for node_id in node_ids]}


def remove_placement_groups(prefix: str) -> int:
    """Remove every placement group whose name starts with ``prefix``; how many were removed."""
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = 0
    for pg_id, pg in placement_group_table().items():
        if pg.get("name", "").startswith(prefix) and pg.get("state") != "REMOVED":
            try:
                remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
                removed += 1
            except Exception:  # noqa: BLE001 - removed meanwhile
                pass
    return removed


def kv_put(key: bytes, value: bytes, namespace: str) -> None:
    _internal_kv()._internal_kv_put(key, value, True, namespace=namespace)


def kv_get(key: bytes, namespace: str) -> bytes | None:
    raw = _internal_kv()._internal_kv_get(key, namespace=namespace)
    return bytes(raw) if raw else None


def kv_del(key: bytes, namespace: str) -> None:
    _internal_kv()._internal_kv_del(key, namespace=namespace)


def _internal_kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def queue_on_workers(workers: list[Any], fn: Any, *args: Any) -> list[Any]:
    """``fn(rank, *args)`` queued on each worker (``Worker.execute_async``, 2.50-2.60), unawaited: an
    actor runs calls in order, so it runs before Train's next ones (its process group's set-up)."""
    return [
        w.execute_async(fn, w.distributed_context.world_rank if w.distributed_context else i, *args)
        for i, w in enumerate(workers)
    ]


def add_report_hook(hook: Any) -> bool:
    """On a train worker with its context: ``hook`` wraps its reports as a ``TrainContextCallback``
    (``execution_context.train_context_callbacks``, 2.50-2.60); False where there is none."""
    from ray.train.v2._internal.execution.context import get_train_context

    callbacks = getattr(getattr(get_train_context(), "execution_context", None), "train_context_callbacks", None)
    if isinstance(callbacks, list) and not any(type(c) is type(hook) for c in callbacks):
        callbacks.append(hook)
    return isinstance(callbacks, list)
