"""Ray Tune's internals: the current trial, a trial's actor, storage and folder, where an actor runs
and its GPU slots (see the package's docstring for the release of each name)."""

from __future__ import annotations

import time
import warnings
from typing import Any, NamedTuple

from .._gpu_ids import gpu_slots
from .core import actor_state


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
