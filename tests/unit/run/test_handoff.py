"""The Train/Tune hand-off: every value that crosses Ray's key-value store between a Train run
inside a trial and the trial's run is a frozen dataclass with one ``to_json`` and ``from_json``;
each comes back equal, its wire form holds what the reader needs and nothing secret, and the
store's functions write and read them under the trial's keys."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ray_wandb_nodes._config.values import OnHang
from ray_wandb_nodes._fleet import HangSetting
from ray_wandb_nodes._hang import HangTimeout
from ray_wandb_nodes._run import handoff as _handoff
from ray_wandb_nodes._run.handoff import AttemptState, TrialHang, TrialMark, TrialWorkers, WorkerPlace

WORKERS = TrialWorkers(
    (WorkerPlace("node-b", "host-b", 1), WorkerPlace("node-a", "host-a", 2), WorkerPlace("node-a", "host-a", 0)),
    "trial.a1.0badcafe",
)
VALUES: list[Any] = [
    TrialMark("trial-run-1"),
    WORKERS,
    TrialWorkers(),
    TrialHang(HangSetting(HangTimeout(seconds=4.0), OnHang.RESTART, 1800.0)),
    TrialHang(HangSetting(HangTimeout(auto=True))),
    AttemptState(frozenset({0, 2}), 5),
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_each_value_comes_back_equal_from_its_json(value: Any) -> None:
    raw = value.to_json()
    assert isinstance(raw, bytes)
    assert type(value).from_json(raw) == value


def test_the_wire_forms_hold_what_the_reader_needs() -> None:
    assert json.loads(TrialMark("trial-run-1").to_json()) == {"run_id": "trial-run-1"}
    assert json.loads(WORKERS.to_json()) == {
        "workers": [
            {"node_id": "node-b", "hostname": "host-b", "rank": 1},
            {"node_id": "node-a", "hostname": "host-a", "rank": 2},
            {"node_id": "node-a", "hostname": "host-a", "rank": 0},
        ],
        "attempt": "trial.a1.0badcafe",
    }
    hang = TrialHang(HangSetting(HangTimeout(seconds=4.0), OnHang.RESTART, 1800.0))
    assert json.loads(hang.to_json()) == {"seconds": 4.0, "auto": False, "on_hang": "restart", "pg_timeout_s": 1800.0}


def test_the_ranks_of_each_node_come_sorted_and_nothing_published_is_no_workers() -> None:
    assert WORKERS.ranks() == {"node-b": (1,), "node-a": (0, 2)}
    assert TrialWorkers.from_json(None) == TrialWorkers() and TrialWorkers().ranks() == {}
    assert TrialWorkers.from_json(b'{"workers": [], "attempt": null}').attempt is None


def test_nothing_secret_crosses() -> None:
    # Only ids, hostnames, ranks and settings: no key, no base URL, no token of any kind.
    every = b" ".join(v.to_json() for v in VALUES).lower()
    for secret in (b"api_key", b"key", b"token", b"http", b"password", b"secret"):
        assert secret not in every


def test_the_store_functions_write_and_read_each_value_under_the_trials_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    store: dict[tuple[bytes, str], bytes] = {}
    monkeypatch.setattr(_handoff._ray, "kv_put", lambda key, value, ns: store.__setitem__((key, ns), value))
    monkeypatch.setattr(_handoff._ray, "kv_get", lambda key, ns: store.get((key, ns)))
    monkeypatch.setattr(_handoff._ray, "kv_del", lambda key, ns: store.pop((key, ns), None))

    # Nothing published yet: no mark, no workers, no hang setting, an empty attempt.
    assert _handoff.trial_mark("t1") is None and _handoff.hang_setting("t1") is None
    assert _handoff.trial_workers("t1") == TrialWorkers() and _handoff.attempt_state("t1") == AttemptState()

    setting = HangSetting(HangTimeout(seconds=4.0), OnHang.ALERT, 600.0)
    _handoff.mark_trial("t1", TrialMark("run-1"))
    _handoff.publish_workers("t1", WORKERS)
    _handoff.publish_hang("t1", setting)
    _handoff.publish_attempt("t1", AttemptState(frozenset({1}), 3))
    assert _handoff.trial_mark("t1") == TrialMark("run-1")
    assert _handoff.trial_workers("t1") == WORKERS
    assert _handoff.hang_setting("t1") == setting
    assert _handoff.attempt_state("t1") == AttemptState(frozenset({1}), 3)
    assert _handoff.trial_mark("t2") is None  # another trial's keys are its own

    _handoff.clear_trial("t1")
    assert store == {}
