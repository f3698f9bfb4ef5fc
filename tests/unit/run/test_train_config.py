"""The Train run's pure rules: its config, what a placement adds to it, the "best" checkpoint."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.values import OnHang
from ray_wandb_nodes._ray import TrainStart
from ray_wandb_nodes._run.train_run import placement_config, train_config
from ray_wandb_nodes._wandb.artifacts import checkpoint_aliases
from ray_wandb_nodes._wandb.strategies import Placement


def start(**overrides: Any) -> TrainStart:
    fields: dict[str, Any] = dict(
        run_name="exp",
        storage_path="/tmp/results",
        train_loop_config={"lr": 0.1, "epochs": 3},
        num_workers=4,
        use_gpu=False,
        experiment_fs_path=None,
        storage_filesystem=None,
        score_attribute=None,
        score_order="max",
    )
    fields.update(overrides)
    return TrainStart(**fields)


def test_config_is_the_loop_config_then_the_users_then_ray_train() -> None:
    options = build_options(config={"epochs": 5, "team": "a"}, strategy="node")
    assert train_config(options, start()) == {
        "lr": 0.1,
        "epochs": 5,
        "team": "a",
        "ray_train": {"run_name": "exp", "num_workers": 4, "use_gpu": False, "strategy": "node"},
    }


def test_config_leaves_the_loop_config_out_when_log_config_is_off() -> None:
    options = build_options(log_config=False, config={"team": "a"})
    assert set(train_config(options, start())) == {"team", "ray_train"}


def test_config_without_a_loop_config() -> None:
    assert set(train_config(build_options(), start(train_loop_config=None))) == {"ray_train"}


def test_placement_adds_world_size_and_ranks_by_node_label() -> None:
    placements = [
        Placement(rank=0, node_id="aaaaaa11", hostname="h1"),
        Placement(rank=1, node_id="bbbbbb22", hostname="h2"),
        Placement(rank=2, node_id="aaaaaa11", hostname="h1"),
    ]
    assert placement_config(placements) == {
        "ray_train": {"world_size": 3, "ranks_by_node": {"node-h1-aaaaaa": [0, 2], "node-h2-bbbbbb": [1]}}
    }


@pytest.mark.parametrize(
    ("score", "best", "maximize", "aliases", "new_best"),
    [
        (0.5, None, True, ["latest", "best"], 0.5),  # the first scored checkpoint is the best
        (0.7, 0.5, True, ["latest", "best"], 0.7),
        (0.4, 0.5, True, ["latest"], 0.5),
        (0.5, 0.5, True, ["latest"], 0.5),  # a tie keeps the earlier best
        (0.4, 0.5, False, ["latest", "best"], 0.4),  # "min": lower is better
        (0.6, 0.5, False, ["latest"], 0.5),
        (None, 0.5, True, ["latest"], 0.5),  # no score reported
        ("high", None, True, ["latest"], None),  # not a number
        (True, None, True, ["latest"], None),  # a bool is not a score
        (3, None, True, ["latest", "best"], 3.0),
    ],
)
def test_best_checkpoint_rule(
    score: Any, best: float | None, maximize: bool, aliases: list[str], new_best: float | None
) -> None:
    got_aliases, got_best = checkpoint_aliases(score, best, maximize)
    assert got_aliases == aliases
    assert got_best == new_best and (got_best is None or isinstance(got_best, float))
    assert not (isinstance(got_best, float) and math.isnan(got_best))


def test_an_aborts_warning_names_each_pending_checkpoint_once() -> None:
    from ray_wandb_nodes._run.train_run import abort_uploads_warning

    text = abort_uploads_warning(10.0, ["checkpoint-r", "checkpoint-r", "checkpoint-t"], "checkpoint-r")
    assert text == (
        "the run was aborted: it ends within 10s without waiting for checkpoint uploads (upload_timeout "
        "bounds a run's end, not an abort): 3 checkpoint(s) not yet handed to W&B are dropped "
        "(checkpoint-r x2, checkpoint-t); the upload of checkpoint-r, the last one logged, is cut short "
        "if W&B has not finished it"
    )
    assert "dropped" not in abort_uploads_warning(3.0, [], "checkpoint-r")


# the ranks that finished training, to the hang watch ---------------------------------------------
def poll(**statuses: tuple[bool, Exception | None]) -> Any:
    """Train's ``WorkerGroupPollStatus``: rank -> (running, error)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        worker_statuses={int(r[1:]): SimpleNamespace(running=run, error=err) for r, (run, err) in statuses.items()}
    )


def test_a_rank_finished_when_its_train_function_returned_not_when_it_failed() -> None:
    from ray_wandb_nodes._ray import finished_ranks

    status = poll(r0=(False, None), r1=(False, RuntimeError("HangError")), r2=(True, None), r3=(True, TimeoutError()))
    assert finished_ranks(status) == frozenset({0})


def test_the_poll_hook_tells_the_run_or_the_trial_which_ranks_finished_as_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading
    from types import SimpleNamespace

    from ray_wandb_nodes._fleet.commands import RanksFinished
    from ray_wandb_nodes._run import handoff as _handoff
    from ray_wandb_nodes._run import trial_relay as _trial_relay
    from ray_wandb_nodes._run.train_controller import TrainController
    from ray_wandb_nodes._run.train_failures import AttemptFailures
    from ray_wandb_nodes._run.train_run import TrainRun
    from ray_wandb_nodes._warn import Warner

    # A Train run of its own: a command on the fleet's queue when the set changes, none otherwise.
    sent: list[Any] = []
    run = object.__new__(TrainRun)  # no Ray: only what the hook reaches
    run.hang_run, run._finished_ranks = "run-1", frozenset()
    run.fleet = SimpleNamespace(ranks_finished=lambda run_id, ranks: sent.append(RanksFinished(run_id, ranks)))  # type: ignore[assignment]
    hook = TrainController.polled  # what the callback's after_worker_group_poll_status calls
    workers = SimpleNamespace(hang_run="run-1", group=None)
    callback = SimpleNamespace(workers=workers, run=run, relay=None, failures=AttemptFailures())
    for status in (poll(r0=(True, None), r1=(True, None)), poll(r0=(False, None), r1=(True, None))):
        hook(callback, status)
        hook(callback, status)
    restarted = poll(r0=(True, None), r1=(True, None))  # a new worker group: none finished
    hook(callback, restarted)
    assert sent == [RanksFinished("run-1", frozenset({0})), RanksFinished("run-1", frozenset())]
    # Its reports: a checkpoint's tells the watch where a hang's place counts from.
    checkpoints: list[tuple[str, int]] = []
    run.fleet.checkpointed = lambda run_id, reports: checkpoints.append((run_id, reports))  # type: ignore[attr-defined]
    run.options, run.sessions, run._reports = SimpleNamespace(upload_checkpoints=False), {}, 0  # type: ignore[assignment]
    run.report([{"loss": 1.0}], None)
    run.report([{"loss": 0.5}], object())
    assert checkpoints == [("run-1", 2)]

    # Inside a Tune trial: through the hand-off, in order, off the event loop, with where the
    # attempt last checkpointed (its reports then; 0 as it starts).
    written: list[tuple[str, Any]] = []
    done = threading.Event()

    def publish(trial_id: str, state: Any) -> None:
        written.append((trial_id, state))
        if len(written) == 3:
            done.set()

    monkeypatch.setattr(_handoff, "publish_attempt", publish)
    monkeypatch.setattr(_handoff, "publish_workers", lambda trial_id, placements, attempt=None: None)
    monkeypatch.setattr(_handoff, "publish_hang", lambda trial_id, setting: None)
    relay = _trial_relay.TrialRelay("trial-1", Warner())
    start = SimpleNamespace(pg_timeout_s=1800.0)
    monkeypatch.setattr(_trial_relay._ray, "train_start", lambda ctx: start)
    options = SimpleNamespace(
        hang_timeout_s=SimpleNamespace(enabled=True, seconds=4.0, auto=False), on_hang=OnHang.ALERT
    )
    assert relay.hangs(_handoff.TrialMark("trial-run"), options, None) == "trial-run"
    relay.placed([], None)
    callback = SimpleNamespace(
        workers=SimpleNamespace(hang_run="trial-run", group=None),
        run=None,
        relay=relay,
        failures=AttemptFailures(),
    )
    relay.reported(checkpoint=False)
    relay.reported(checkpoint=True)
    for status in (poll(r0=(False, None), r1=(True, None)),) * 2 + (poll(r0=(False, None), r1=(False, None)),):
        hook(callback, status)
    assert done.wait(5)
    assert written == [
        ("trial-1", _handoff.AttemptState(frozenset(), 2)),  # placed: 0 as it was; then the checkpoint
        ("trial-1", _handoff.AttemptState(frozenset({0}), 2)),
        ("trial-1", _handoff.AttemptState(frozenset({0, 1}), 2)),
    ]
