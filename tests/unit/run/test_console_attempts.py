"""What the Train callback tells the fleet of its ranks' console (``rank_console``): each rank's
process id with its placement, read from Train's worker metadata; an attempt's end at each
worker-group shutdown, failed when one of its polls held a rank's error (the controller decides
on that poll), else not; a new worker group starts clean, and so does a replaced replica group
(its failed ranks ended with their processes). No Ray: Train's objects are stand-ins."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from ray_wandb_nodes import _ray, train
from ray_wandb_nodes._config.values import ConsoleMode, Strategy
from ray_wandb_nodes._fleet.commands import AttemptEnded, SetNodes
from ray_wandb_nodes._run.train_controller import TrainController
from ray_wandb_nodes._run.train_failures import AttemptFailures
from ray_wandb_nodes._run.train_run import console_mode
from ray_wandb_nodes._run.train_workers import TrainWorkers
from ray_wandb_nodes._warn import Warner


def poll(**statuses: tuple[bool, Exception | None]) -> Any:
    """Train's ``WorkerGroupPollStatus``: rank -> (running, error)."""
    return SimpleNamespace(
        worker_statuses={int(r[1:]): SimpleNamespace(running=run, error=err) for r, (run, err) in statuses.items()}
    )


def worker(rank: int, pid: int) -> Any:
    """A Train ``Worker`` as ``placements_of`` reads it."""
    metadata = SimpleNamespace(node_id=f"n{rank}", hostname="h", accelerator_ids={}, pid=pid)
    return SimpleNamespace(metadata=metadata, distributed_context=SimpleNamespace(world_rank=rank))


def test_each_ranks_process_id_comes_with_its_placement() -> None:
    assert [(p.rank, p.pid) for p in _ray.placements_of([worker(1, 4242), worker(0, 4243)])] == [(1, 4242), (0, 4243)]


def test_a_poll_fails_the_attempt_when_a_rank_has_an_error() -> None:
    assert not _ray.poll_failed(poll(r0=(True, None), r1=(False, None)))
    assert _ray.poll_failed(poll(r0=(True, None), r1=(False, ValueError("bad shard 17"))))


class Run:
    """The Train run as the hooks reach it: the attempts' ends they tell it."""

    def __init__(self) -> None:
        self.ended: list[bool] = []
        self.hang_run = None

    def attempt_ended(self, failed: bool) -> None:
        self.ended.append(failed)

    def workers_placed(self, placements: Any, attempt: Any = None) -> None:
        pass

    def ranks_finished(self, ranks: frozenset[int]) -> None:
        pass


def callback() -> tuple[Any, Run]:
    run = Run()
    cb = object.__new__(train.WandbNodesCallback)  # no Ray: only what the hooks reach
    cb._warner = Warner()
    cb._controller = controller = object.__new__(TrainController)
    controller.run, controller.relay, controller.workers = run, None, TrainWorkers(Warner())
    controller.failures = AttemptFailures()  # the attempt's failure: its one state on the controller
    return cb, run


def test_an_attempt_ends_failed_only_after_a_poll_with_an_error() -> None:
    cb, run = callback()
    cb.before_worker_group_start(None)
    cb.after_worker_group_poll_status(poll(r0=(True, None), r1=(True, None)))
    cb.before_worker_group_shutdown(None)  # a healthy attempt's end (training done, or a resize)
    cb.before_worker_group_start(None)
    cb.after_worker_group_poll_status(poll(r0=(True, None), r1=(False, ValueError("bad shard 17"))))
    cb.after_worker_group_poll_status(poll(r0=(True, None), r1=(True, None)))  # a later poll forgets nothing
    cb.before_worker_group_shutdown(None)  # the failed attempt's end (a retry, or the run's end)
    cb.before_worker_group_start(None)  # the retry starts clean
    cb.before_worker_group_shutdown(None)
    assert run.ended == [False, True, False]


def test_a_replaced_replica_group_starts_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    cb, run = callback()
    monkeypatch.setattr(train._ray, "worker_placements", lambda group: [])
    monkeypatch.setattr(cb._controller.workers, "setup", lambda group, run_id: None)
    cb.before_worker_group_start(None)
    cb.after_worker_group_poll_status(poll(r0=(True, None), r1=(False, RuntimeError("replica lost"))))
    cb.after_replica_group_start(None)  # Ray replaced the failed replica: the others train on
    cb.before_worker_group_shutdown(None)
    assert run.ended == [False]


def test_the_run_sends_its_ranks_pids_and_ends_its_attempts_on_the_fleets_queue() -> None:
    from ray_wandb_nodes._fleet import SharedTarget
    from ray_wandb_nodes._run.session import SharedSession
    from ray_wandb_nodes._run.train_run import TrainRun

    sent: list[Any] = []
    fleet = SimpleNamespace(
        set_run_nodes=lambda run_id, nodes, covered, **kw: sent.append(SetNodes(run_id, set(nodes), covered, **kw)),
        attempt_ended=lambda run_id, failed: sent.append(AttemptEnded(run_id, failed)),
    )
    primary = SimpleNamespace(spec=SimpleNamespace(run_id="run-1"), update_config=lambda config: None)
    target = SharedTarget.__new__(SharedTarget)  # what the session reads of it at its start
    target.health, target.wants_report = None, threading.Event()
    session = SharedSession(target, primary, fleet, 30.0)  # type: ignore[arg-type]
    run = object.__new__(TrainRun)  # no Ray: only what the calls reach
    run.options, run.base_id, run.node_id, run.hang_run = (
        SimpleNamespace(strategy=Strategy.SHARED),
        "run-1",
        "head",
        None,
    )
    run.sessions = {"run-1": session}
    run.workers_placed(_ray.placements_of([worker(0, 100), worker(1, 101)]))
    run.attempt_ended(failed=True)
    assert [s.pids if isinstance(s, SetNodes) else s for s in sent] == [{0: 100, 1: 101}, AttemptEnded("run-1", True)]


@pytest.mark.parametrize(
    ("strategy", "rank_console", "mode"),
    [("shared", "rank0", "rank0"), ("shared", "all", "all"), ("main", "rank0", "off"), ("node", "all", "off")],
)
def test_only_the_shared_strategy_reads_its_ranks_console(strategy: str, rank_console: str, mode: str) -> None:
    """Its node writers read each node's ranks; the other strategies have none that join one run."""
    options = SimpleNamespace(strategy=Strategy(strategy), rank_console=ConsoleMode(rank_console))
    assert console_mode(options) is ConsoleMode(mode)  # type: ignore[arg-type]
