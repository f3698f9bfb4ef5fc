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

Each value that crosses is a frozen dataclass defined here with its one ``to_json`` and
``from_json`` (:class:`TrialMark`, :class:`TrialWorkers`, :class:`TrialHang`,
:class:`AttemptState`, :class:`TrialFailures`); the functions below write and read them under
the trial's keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .. import _ray
from .._config.values import HangTimeout, OnHang
from .._failure import FailedAttempt, FailureEvent
from .._fleet import HangSetting

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


@dataclass(frozen=True)
class TrialFailures:
    """Every failed attempt and recovery of the Train run inside a trial so far, in order (it
    publishes them whole each time: the trial's run takes the ones it has not taken yet)."""

    events: tuple[FailureEvent, ...] = ()

    def to_json(self) -> bytes:
        data = [{"recovered": e} if isinstance(e, int) else {"failed": json.loads(e.to_json())} for e in self.events]
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> TrialFailures:
        """The published value (nothing yet: no events)."""
        events: list[FailureEvent] = []
        for item in json.loads(raw) if raw else []:
            if "recovered" in item:
                events.append(int(item["recovered"]))
            elif "failed" in item:
                events.append(FailedAttempt.from_json(json.dumps(item["failed"])))
        return cls(tuple(events))


def publish_failures(trial_id: str, failures: TrialFailures) -> None:
    _ray.kv_put(_failures_key(trial_id), failures.to_json(), NAMESPACE)


def trial_failures(trial_id: str) -> TrialFailures:
    """The trial's Train run's failed attempts and recoveries, as it last published them."""
    return TrialFailures.from_json(_ray.kv_get(_failures_key(trial_id), NAMESPACE))


@dataclass(frozen=True)
class TrialMark:
    """The mark of a trial that ``WandbNodesTuneCallback`` logs, set before the trial's function
    runs: a Train run inside the trial joins the trial's W&B run instead of opening its own."""

    run_id: str  # the trial's W&B run: the run whose ranks a Train run inside it arms for hangs

    def to_json(self) -> bytes:
        return json.dumps({"run_id": self.run_id}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TrialMark:
        return cls(str(json.loads(raw)["run_id"]))


@dataclass(frozen=True)
class WorkerPlace:
    """Where one train rank of the Train run inside a trial runs (part of :class:`TrialWorkers`)."""

    node_id: str  # Ray's NodeID: the trial's run gets a node writer there
    hostname: str
    rank: int  # the rank's world rank


@dataclass(frozen=True)
class TrialWorkers:
    """Where the Train run inside a trial has its ranks now (each worker-group start publishes it
    again), and the key of the attempt they armed in for hangs (their folder on each node)."""

    workers: tuple[WorkerPlace, ...] = ()  # none: nothing published yet
    attempt: str | None = None  # ``_hang.attempt_key``; None: not armed for hangs

    def ranks(self) -> dict[str, tuple[int, ...]]:
        """The ranks on each node (node id -> its ranks, sorted)."""
        ranks: dict[str, list[int]] = {}
        for w in self.workers:
            ranks.setdefault(w.node_id, []).append(w.rank)
        return {node: tuple(sorted(r)) for node, r in ranks.items()}

    def to_json(self) -> bytes:
        workers = [{"node_id": w.node_id, "hostname": w.hostname, "rank": w.rank} for w in self.workers]
        return json.dumps({"workers": workers, "attempt": self.attempt}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> TrialWorkers:
        """The published value (nothing yet: no workers)."""
        if not raw:
            return cls()
        data = json.loads(raw)
        workers = tuple(WorkerPlace(str(w["node_id"]), str(w["hostname"]), int(w["rank"])) for w in data["workers"])
        attempt = data.get("attempt")
        return cls(workers, str(attempt) if attempt else None)


@dataclass(frozen=True)
class TrialHang:
    """The hang setting of the Train run inside a trial (its ``hang_timeout_s``, ``on_hang`` and
    torch's process-group timeout), published as it starts, for the trial's run to watch its ranks."""

    setting: HangSetting

    def to_json(self) -> bytes:
        s = self.setting
        data = {"seconds": s.timeout.seconds, "auto": s.timeout.auto, "on_hang": s.on_hang.value}
        return json.dumps({**data, "pg_timeout_s": s.pg_timeout_s}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TrialHang:
        data = json.loads(raw)
        seconds, pg = data.get("seconds"), data.get("pg_timeout_s")
        timeout = HangTimeout(seconds=None if seconds is None else float(seconds), auto=bool(data.get("auto")))
        on_hang = OnHang(data.get("on_hang", OnHang.ALERT.value))  # as the Train run's options checked it
        return cls(HangSetting(timeout, on_hang, None if pg is None else float(pg)))


def mark_trial(trial_id: str, mark: TrialMark) -> None:
    _ray.kv_put(_trial_key(trial_id), mark.to_json(), NAMESPACE)


def trial_mark(trial_id: str) -> TrialMark | None:
    """The trial's mark; None when the Tune callback does not log it."""
    raw = _ray.kv_get(_trial_key(trial_id), NAMESPACE)
    return TrialMark.from_json(raw) if raw else None


def publish_workers(trial_id: str, workers: TrialWorkers) -> None:
    _ray.kv_put(_workers_key(trial_id), workers.to_json(), NAMESPACE)


def trial_workers(trial_id: str) -> TrialWorkers:
    """Where the trial's Train run has its ranks, as it last published it (nothing yet: none)."""
    return TrialWorkers.from_json(_ray.kv_get(_workers_key(trial_id), NAMESPACE))


def publish_hang(trial_id: str, setting: HangSetting) -> None:
    _ray.kv_put(_hang_key(trial_id), TrialHang(setting).to_json(), NAMESPACE)


def hang_setting(trial_id: str) -> HangSetting | None:
    """The hang setting the trial's Train run published; None: none (hangs are not watched)."""
    raw = _ray.kv_get(_hang_key(trial_id), NAMESPACE)
    return TrialHang.from_json(raw).setting if raw else None


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
