"""Handoff between the Tune callback and a Train run inside one of its trials.

A trial that wraps a ``TorchTrainer`` runs a Train controller whose workers sit on other
nodes than the trial actor. The Tune callback marks each trial it logs in Ray's internal
key-value store (GCS) before the trial's function starts; a ``WandbNodesCallback`` in that
trial's Train run finds the mark and, instead of opening its own W&B run, publishes its
worker placement, so the Tune callback's node fleet adds those nodes to the trial's run, its
hang setting, so the trial's run watches those ranks, and the ranks that finished training, so that
the trial's run neither judges them nor leaves a hang open when they end it. Nothing secret goes
through the store: only node ids, hostnames, ranks and the hang setting.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import _ray

NAMESPACE = "ray_wandb_nodes"


def _trial_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}".encode()


def _workers_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/workers".encode()


def _hang_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/hang".encode()


def _finished_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/finished".encode()


def mark_trial(trial_id: str, run_id: str) -> None:
    _ray.kv_put(_trial_key(trial_id), json.dumps({"run_id": run_id}).encode(), NAMESPACE)


def trial_mark(trial_id: str) -> dict[str, Any] | None:
    raw = _ray.kv_get(_trial_key(trial_id), NAMESPACE)
    return json.loads(raw) if raw else None


def publish_workers(trial_id: str, placements: Sequence[dict[str, Any]]) -> None:
    _ray.kv_put(_workers_key(trial_id), json.dumps(list(placements)).encode(), NAMESPACE)


def worker_nodes(trial_id: str) -> set[str]:
    return set(worker_ranks(trial_id))


def worker_ranks(trial_id: str) -> dict[str, tuple[int, ...]]:
    """The ranks of the trial's Train run on each node, as it last published them."""
    raw = _ray.kv_get(_workers_key(trial_id), NAMESPACE)
    ranks: dict[str, list[int]] = {}
    for p in json.loads(raw) if raw else []:
        ranks.setdefault(str(p["node_id"]), []).append(int(p["rank"]))
    return {node: tuple(sorted(r)) for node, r in ranks.items()}


def publish_hang(trial_id: str, setting: dict[str, Any]) -> None:
    """The Train run's ``hang_timeout_s``, ``on_hang`` and process-group timeout, as plain data."""
    _ray.kv_put(_hang_key(trial_id), json.dumps(setting).encode(), NAMESPACE)


def hang_setting(trial_id: str) -> dict[str, Any] | None:
    raw = _ray.kv_get(_hang_key(trial_id), NAMESPACE)
    return dict(json.loads(raw)) if raw else None


def publish_finished(trial_id: str, ranks: frozenset[int]) -> None:
    """The Train run's ranks whose train function returned (not those that failed), as they change."""
    _ray.kv_put(_finished_key(trial_id), json.dumps(sorted(ranks)).encode(), NAMESPACE)


def finished_ranks(trial_id: str) -> frozenset[int]:
    """The ranks of the trial's Train run that finished training, as it last published them."""
    raw = _ray.kv_get(_finished_key(trial_id), NAMESPACE)
    return frozenset(int(r) for r in json.loads(raw)) if raw else frozenset()


def clear_trial(trial_id: str) -> None:
    for key in (_trial_key(trial_id), _workers_key(trial_id), _hang_key(trial_id), _finished_key(trial_id)):
        _ray.kv_del(key, NAMESPACE)
