"""Ray core's internals: actors' state and nodes, placement groups pinned to a node, the internal
key-value store, the node's log folder (see the package's docstring for the release of each name)."""

from __future__ import annotations

import os
import warnings
from typing import Any


def actor_state(actor_id: str) -> dict[str, Any] | None:
    """The GCS actor table's entry of ``actor_id`` (None when unknown)."""
    import ray._private.state as state

    info = state.actors(actor_id=actor_id)
    return dict(info) if info else None


def job_ended(job_id: str) -> bool:
    """Whether the GCS job table lists ``job_id`` (hex) as dead: its driver has gone."""
    import ray._private.state as state

    return any(job["JobID"] == job_id and job["IsDead"] for job in state.jobs())


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


def logs_dir() -> str | None:
    """The ``logs`` folder of this node's Ray session, where each worker process's stdout and stderr
    files are (``Node.get_logs_dir_path()`` of ``ray._private.worker._global_node``; else the folder
    of this worker's own ``.out`` file, ``Worker.get_out_file_path()``); None when neither is known
    (Ray not started here, or ``RAY_LOG_TO_STDERR=1``: no files)."""
    try:
        from ray._private import worker

        node = getattr(worker, "_global_node", None)
        if node is not None:
            return str(node.get_logs_dir_path())
        out = worker.global_worker.get_out_file_path()
        return os.path.dirname(out) if out else None
    except Exception:  # noqa: BLE001 - another shape: the ranks' console is not read here (one warning)
        return None


NODE_ID_LABEL = "ray.io/node-id"


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


def free_resources() -> dict[str, dict[str, float]]:
    """Each alive node's free resources (one GCS call); empty when it cannot be read."""
    try:
        from ray._private import state

        free = state.available_resources_per_node()
        return {str(n): {str(k): float(v) for k, v in r.items()} for n, r in free.items()}
    except Exception:  # noqa: BLE001 - the caller falls back to each node's totals
        return {}
