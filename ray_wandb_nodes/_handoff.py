"""Handoff between the Tune callback and a Train run inside one of its trials.

A trial that wraps a ``TorchTrainer`` runs a Train controller whose workers sit on other
nodes than the trial actor. The Tune callback marks each trial it logs in Ray's internal
key-value store (GCS) before the trial's function starts; a ``WandbNodesCallback`` in that
trial's Train run finds the mark and, instead of opening its own W&B run, publishes its
worker placement, so the Tune callback's node fleet adds those nodes to the trial's run.
Nothing secret goes through the store: only node ids, hostnames and ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

NAMESPACE = "ray_wandb_nodes"


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def _trial_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}".encode()


def _workers_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/workers".encode()


def current_trial_id() -> str | None:
    """The id of the Tune trial this process runs in, or None outside Tune."""
    try:
        import warnings

        from ray import tune

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # outside a trial Ray warns and returns None
            trial_id = tune.get_context().get_trial_id()
    except Exception:  # noqa: BLE001 - not in a trial, or Tune not importable
        return None
    return str(trial_id) if trial_id else None


def mark_trial(trial_id: str, run_id: str) -> None:
    _kv()._internal_kv_put(_trial_key(trial_id), json.dumps({"run_id": run_id}).encode(), True, namespace=NAMESPACE)


def trial_mark(trial_id: str) -> dict[str, Any] | None:
    raw = _kv()._internal_kv_get(_trial_key(trial_id), namespace=NAMESPACE)
    return json.loads(raw) if raw else None


def publish_workers(trial_id: str, placements: Sequence[dict[str, Any]]) -> None:
    _kv()._internal_kv_put(_workers_key(trial_id), json.dumps(list(placements)).encode(), True, namespace=NAMESPACE)


def worker_nodes(trial_id: str) -> set[str]:
    raw = _kv()._internal_kv_get(_workers_key(trial_id), namespace=NAMESPACE)
    return {p["node_id"] for p in json.loads(raw)} if raw else set()


def clear_trial(trial_id: str) -> None:
    for key in (_trial_key(trial_id), _workers_key(trial_id)):
        _kv()._internal_kv_del(key, namespace=NAMESPACE)
