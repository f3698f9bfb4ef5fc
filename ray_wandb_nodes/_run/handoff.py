"""Handoff between the Tune callback and a Train run inside one of its trials.

A trial that wraps a ``TorchTrainer`` runs a Train controller whose workers sit on other
nodes than the trial actor. The Tune callback marks each trial it logs in Ray's internal
key-value store (GCS) before the trial's function starts; a ``WandbNodesCallback`` in that
trial's Train run finds the mark and, instead of opening its own W&B run, publishes its
worker placement, so the Tune callback's node fleet adds those nodes to the trial's run, its
hang setting, so the trial's run watches those ranks, its attempt's state (the ranks that
finished training, so that the trial's run neither judges them nor leaves a hang open when they
end it; where the attempt last checkpointed, a hang's place), and its failed attempts and
recoveries, named in the trial's run. Nothing secret goes through the store: node ids,
hostnames, ranks, the hang setting, and what Ray said of a failing rank (its error's text).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _ray
from .._failure import FailedAttempt

NAMESPACE = "ray_wandb_nodes"


def _trial_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}".encode()


def _workers_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/workers".encode()


def _hang_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/hang".encode()


def _attempt_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/attempt".encode()


def _failures_key(trial_id: str) -> bytes:
    return f"tune/{trial_id}/failures".encode()


FailureEvent = FailedAttempt | int  # a failed attempt, or the attempt that recovered after one


def publish_failures(trial_id: str, events: Sequence[FailureEvent]) -> None:
    """Every failed attempt and recovery of the trial's Train run so far, in order."""
    data = [{"recovered": e} if isinstance(e, int) else {"failed": json.loads(e.to_json())} for e in events]
    _ray.kv_put(_failures_key(trial_id), json.dumps(data).encode(), NAMESPACE)


def failure_events(trial_id: str) -> list[FailureEvent]:
    """The trial's Train run's failed attempts and recoveries, as it last published them."""
    raw = _ray.kv_get(_failures_key(trial_id), NAMESPACE)
    out: list[FailureEvent] = []
    for item in json.loads(raw) if raw else []:
        if "recovered" in item:
            out.append(int(item["recovered"]))
        elif "failed" in item:
            out.append(FailedAttempt.from_json(json.dumps(item["failed"])))
    return out


def mark_trial(trial_id: str, run_id: str) -> None:
    _ray.kv_put(_trial_key(trial_id), json.dumps({"run_id": run_id}).encode(), NAMESPACE)


def trial_mark(trial_id: str) -> dict[str, Any] | None:
    raw = _ray.kv_get(_trial_key(trial_id), NAMESPACE)
    return json.loads(raw) if raw else None


def publish_workers(trial_id: str, placements: Sequence[dict[str, Any]], attempt: str | None = None) -> None:
    """Where the trial's train ranks run, and the key of the attempt they armed in for hangs."""
    data = {"workers": list(placements), "attempt": attempt}
    _ray.kv_put(_workers_key(trial_id), json.dumps(data).encode(), NAMESPACE)


def worker_nodes(trial_id: str) -> set[str]:
    return set(worker_ranks(trial_id))


def worker_ranks(trial_id: str) -> dict[str, tuple[int, ...]]:
    """The ranks of the trial's Train run on each node, as it last published them."""
    return published_workers(trial_id)[0]


def published_workers(trial_id: str) -> tuple[dict[str, tuple[int, ...]], str | None]:
    """The ranks of the trial's Train run on each node, and the key of their attempt (None: not
    armed for hangs), as it last published them."""
    raw = _ray.kv_get(_workers_key(trial_id), NAMESPACE)
    data = json.loads(raw) if raw else {}
    ranks: dict[str, list[int]] = {}
    for p in data.get("workers", []):
        ranks.setdefault(str(p["node_id"]), []).append(int(p["rank"]))
    attempt = data.get("attempt")
    return {node: tuple(sorted(r)) for node, r in ranks.items()}, str(attempt) if attempt else None


def publish_hang(trial_id: str, setting: dict[str, Any]) -> None:
    """The Train run's ``hang_timeout_s``, ``on_hang`` and process-group timeout, as plain data."""
    _ray.kv_put(_hang_key(trial_id), json.dumps(setting).encode(), NAMESPACE)


def hang_setting(trial_id: str) -> dict[str, Any] | None:
    raw = _ray.kv_get(_hang_key(trial_id), NAMESPACE)
    return dict(json.loads(raw)) if raw else None


@dataclass(frozen=True)
class AttemptState:
    """What the Train run's current attempt tells the trial's hang watch: the ranks whose train
    function returned (not those that failed), and its reports when it last reported a checkpoint
    (0: none yet, the attempt runs from the checkpoint it was restored from)."""

    finished: frozenset[int] = frozenset()
    checkpoint_reports: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"finished": sorted(self.finished), "checkpoint_reports": self.checkpoint_reports}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> AttemptState:
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(frozenset(int(r) for r in data.get("finished", ())), int(data.get("checkpoint_reports", 0)))


def publish_attempt(trial_id: str, state: AttemptState) -> None:
    _ray.kv_put(_attempt_key(trial_id), state.to_json(), NAMESPACE)


def attempt_state(trial_id: str) -> AttemptState:
    """The Train run's current attempt as it last published it (nothing yet: an empty state)."""
    return AttemptState.from_json(_ray.kv_get(_attempt_key(trial_id), NAMESPACE))


def clear_trial(trial_id: str) -> None:
    keys = (_trial_key(trial_id), _workers_key(trial_id), _hang_key(trial_id), _attempt_key(trial_id),
            _failures_key(trial_id))  # fmt: skip
    for key in keys:
        _ray.kv_del(key, NAMESPACE)
