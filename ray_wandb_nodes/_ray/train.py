"""Ray Train V2's internals: the callback bases, the run's start, where each rank runs, calls on the
train workers, a report's checkpoint, the poll's finished ranks (see the package's docstring for
the release of each name)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._gpu_ids import ray_gpu_ids
from .range import ray_version, train_v2_enabled, unsupported_ray


@dataclass(frozen=True)
class Placement:
    """Where one train worker runs (from the worker group's metadata)."""

    rank: int
    node_id: str
    hostname: str
    gpu_ids: tuple[str, ...] = ()  # as Ray names them: "0", "GPU-<uuid>", "MIG-<uuid>"
    pid: int | None = None  # the worker's process (``ActorMetadata.pid``); None where not read


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


def check_ray(*, train: bool) -> None:
    """Raise ``RuntimeError`` saying why when the installed Ray cannot serve the plugin."""
    version = ray_version()
    enabled = train_v2_enabled() if train and version is not None and train_callback_bases() != (object,) else None
    problem = unsupported_ray(version, train=train, v2_enabled=enabled)
    if problem is not None:
        raise RuntimeError(f"ray_wandb_nodes: {problem}")


# The NCCL hang detector's logger on the controller, its folder under the experiment (2.60).
NCCL_DETECTOR_LOGGER, NCCL_DETECTOR_DIR = "ray.train.v2._internal.callbacks.nccl_ras", "hang_detector"


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
            pid=_int_or_none(getattr(w.metadata, "pid", None)),
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


def poll_failed(poll_status: Any) -> bool:
    """Whether a poll holds a rank's error (``WorkerStatus.error``, 2.50-2.60): the attempt failed,
    for Ray's controller decides on the first such poll."""
    return any(s.error is not None for s in poll_status.worker_statuses.values())


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


def add_shutdown_hook(hook: Callable[[], object]) -> bool:
    """On a train worker with its context: ``hook()`` when Ray Train asks the worker to stop
    (``RayTrainWorker.shutdown``, which the worker group calls on every worker before it kills
    them: ``worker_group/state.py`` ``_shutdown_workers``, 5 s of patience, 2.50-2.60). The
    worker's ``WorkerCallback`` list is ``RayTrainWorker._callbacks`` (``worker.py``, set by
    ``init_train_context``, 2.50-2.60) of the actor instance this process runs
    (``ray._private.worker.global_worker.actors``, keyed by its actor id, 2.50-2.60). The hook runs
    on the actor's thread, while the train function may still run on its own. False where any of
    these is missing (no record of the stop then: the run judges as before)."""
    try:
        from ray._private import worker as core
        from ray.train.v2._internal.execution.callback import WorkerCallback
    except ImportError:
        return False
    actor = getattr(core.global_worker, "actors", {}).get(getattr(core.global_worker, "actor_id", None))
    callbacks = getattr(actor, "_callbacks", None)
    if not isinstance(callbacks, list):
        return False

    class _Stopped(WorkerCallback):  # type: ignore[misc]
        def before_worker_shutdown(self) -> None:
            try:
                hook()
            except Exception:  # noqa: BLE001 - never in the way of Ray's shutdown
                pass

    if not any(type(c).__name__ == "_Stopped" for c in callbacks):
        callbacks.append(_Stopped())
    return True


def hook_group_shutdown(hook: Callable[[], object]) -> bool:
    """On a train worker: ``hook()`` before its torch process group is destroyed. Ray Train's
    ``TorchConfig`` backend destroys it on every worker first thing in a worker group's shutdown
    (``_TorchBackend.on_shutdown`` runs ``_shutdown_torch``, which calls
    ``torch.distributed.destroy_process_group()`` by attribute, 2.50-2.60), before any
    ``WorkerCallback.before_worker_shutdown``: the groups' positions are gone by then. Wraps that
    attribute once a process; False where torch.distributed is not imported."""
    import sys

    dist = sys.modules.get("torch.distributed")
    original = getattr(dist, "destroy_process_group", None)
    if dist is None or original is None:
        return False
    global _on_group_shutdown
    _on_group_shutdown = hook
    if getattr(original, "_rwn_hook", False):
        return True

    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:  # the default group's end only (``group=None``); a subgroup's ends nothing of the rank's
            if _on_group_shutdown is not None and (args[0] if args else kwargs.get("group")) is None:
                _on_group_shutdown()
        except Exception:  # noqa: BLE001 - never in the way of the group's end
            pass
        return original(*args, **kwargs)

    destroy_process_group._rwn_hook = True  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(dist, "destroy_process_group", destroy_process_group)  # noqa: B010 - a module's attribute, by name
    return True


_on_group_shutdown: Callable[[], object] | None = None


def training_thread_frames() -> list[Any]:
    """The stack of the thread that runs the train function in this worker (``FrameSummary``
    list, outermost first; [] where none is found): the thread whose stack runs through Ray
    Train's ``thread_runner.py`` (``ThreadRunner._run_target``, 2.50-2.60)."""
    import sys
    import threading
    import traceback

    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        frames = traceback.extract_stack(frame)
        if any(f.filename.endswith("thread_runner.py") for f in frames):
            return list(frames)
    return []
