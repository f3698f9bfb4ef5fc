"""The node logger's state, through the real ``NodeLogger`` class in this process (no Ray: the node
id its status reports is all it asks of Ray; the writers are stand-ins for wandb's runs). One
record a hosted writer; a status that never waits on a writer's join; and ranks watched apart
from writers, so a writer's end (a straggler's node promoted past the writer cap) or a writer
that failed to join leaves its node's ranks watched. Ray's concurrency groups themselves, on a
real actor, are in ``tests/e2e/test_faults.py``."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from ray_wandb_nodes._fleet import node_logger
from ray_wandb_nodes._fleet.node_logger import NodeLogger
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.plan import observer_key
from ray_wandb_nodes._fleet.pool import LoggerPool
from ray_wandb_nodes._hang.beacon import read_slots
from ray_wandb_nodes._hang.evidence import EvidencePaths
from ray_wandb_nodes._hang.folders import attempt_key, run_dir
from ray_wandb_nodes._wandb.writers import Role, WriterSpec
from ray_wandb_nodes._warn import Warner
from tests.support.fakes import logger_status
from tests.support.hang_fixtures import rank_process

ATTEMPT = attempt_key("run-1", 1, "0000000c")


class Run:
    """What the logger asks of a wandb run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.finished = False
        self.summary: dict[str, Any] = {}

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def finish(self, exit_code: int | None = None) -> None:
        self.finished = True


def spec(key: str, role: str = "node") -> WriterSpec:
    return WriterSpec(
        role=Role(role), label="node-a", init_kwargs={"id": key}, settings={"x_stats_sampling_interval": 60}
    )


@pytest.fixture
def logger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodeLogger:
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1"))
    monkeypatch.setattr(node_logger, "node_dir", lambda *args, **kwargs: str(tmp_path / "wandb"))
    return NodeLogger(root=tmp_path)


def test_a_writers_end_leaves_the_ranks_its_node_watches_watched(
    logger: NodeLogger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the writer cap, a straggler's node is promoted: its observer writer finishes and a
    member joins. Its ranks train on: their beacons and dump FIFOs stay, and every status carries
    their progress throughout (the logger once removed the run's folder with the writer)."""
    monkeypatch.setattr(node_logger, "init_writer", lambda spec, **_: Run())
    folder = run_dir(ATTEMPT, tmp_path)
    with rank_process(folder, 0, armed=True) as proc:
        logger.add_writer(spec(observer_key("run-1"), role="observer"))
        logger.watch(ATTEMPT, (0,))
        assert [r.pid for r in logger.status().progress[ATTEMPT]] == [proc.pid]
        finished = logger.finish(observer_key("run-1"))  # promoted: the observer goes
        assert finished.runs == () and [r.rank for r in finished.progress[ATTEMPT]] == [0]
        [slot] = read_slots(folder)
        assert EvidencePaths.of(folder, 0, proc.pid).request.exists()  # its dump FIFO too
        joined = logger.add_writer(spec("run-1"))  # the member joins
        assert joined.runs == ("run-1",) and [r.pid for r in joined.progress[ATTEMPT]] == [slot.pid]


def test_a_node_whose_writer_failed_to_join_watches_its_ranks_anyway(
    logger: NodeLogger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(spec: WriterSpec, **_: Any) -> Any:
        raise PermissionError("403 Forbidden")

    monkeypatch.setattr(node_logger, "init_writer", refused)
    with rank_process(run_dir(ATTEMPT, tmp_path), 0):
        logger.watch(ATTEMPT, (0,))
        status = logger.add_writer(spec("run-1"))
        assert "403 Forbidden" in status.errors["run-1"]
        assert [r.rank for r in status.progress[ATTEMPT]] == [0]


def test_a_status_during_a_join_is_answered_and_names_the_writer_joining(
    logger: NodeLogger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ping while wandb.init waits (on a slow W&B) is answered at once, from another thread, and
    lists the writer being joined: the driver side does not take it for a restarted logger."""
    entered, release = threading.Event(), threading.Event()

    def slow_init(spec: WriterSpec, **_: Any) -> Run:
        entered.set()
        release.wait(30)
        return Run()

    monkeypatch.setattr(node_logger, "init_writer", slow_init)
    logger.log("run-1", {"loss": 1.0})  # a row before its writer: kept for it
    join = threading.Thread(target=logger.add_writer, args=(spec("run-1", role="run"),))
    join.start()
    try:
        assert entered.wait(10)
        status = logger.status()  # returns while the join waits
        assert join.is_alive() and status.runs == ("run-1",) and status.errors == {}
        assert status.labels == {"run-1": "node-a"}
    finally:
        release.set()
        join.join(10)
    logger.log("run-1", {"loss": 0.5})
    status = logger.status()
    assert status.logged == {"run-1": 2}  # the early row, then the new one, in order
    run = logger._hosted["run-1"].run
    assert [row["loss"] for row in run.rows] == [1.0, 0.5]
    assert logger.finish("run-1", exit_code=0).runs == () and run.finished


class Actors:
    """The pool's Ray calls: a logger whose join has not answered yet (queued behind another
    writer's finish, say) and whose pings answer at once, without it."""

    def __init__(self) -> None:
        self.joins: list[WriterSpec] = []
        self.join_answered = False
        logger = SimpleNamespace(
            add_writer=SimpleNamespace(remote=lambda spec, egress=None: self.joins.append(spec) or "join"),
            status=SimpleNamespace(remote=lambda: "ping"),
        )
        self.logger = logger

    def group_prefix(self) -> str:
        return "g-"

    def create(self, node_id: str, name: str) -> tuple[Any, None]:
        return self.logger, None

    def answered(self, refs: list[Any]) -> set[Any]:
        return {r for r in refs if r == "ping" or self.join_answered}

    def result(self, ref: Any) -> Any:
        runs = ("run-1",) if ref == "join" else ()
        return logger_status("n1", 7, runs)


def test_a_ping_answered_before_a_join_it_passed_is_no_restart(caplog: pytest.LogCaptureFixture) -> None:
    """A ping is a control call: it can answer while the writer's join still waits its turn. The
    writer is missing from that answer, and it is neither a restart nor a reason to join again."""
    actors = Actors()
    pool = LoggerPool(init_timeout_s=60.0, warner=Warner(), ping_s=0.0, actors=actors)  # type: ignore[arg-type]
    node = NodeInfo("n1", "host-1", "10.0.0.1")
    pool.start([node])
    pool.add_writer("n1", spec("run-1"))
    for _ in range(3):  # pings come and go while the join waits
        pool.check_joins()
        pool.check_health(lambda key, node: spec(key))
    assert len(actors.joins) == 1 and "restarted" not in caplog.text
    actors.join_answered = True
    pool.check_joins()
    pool.check_health(lambda key, node: spec(key))
    pool.check_health(lambda key, node: spec(key))  # now a ping without it is a writer gone: joined again
    assert len(actors.joins) == 2 and "restarted; its writers rejoin" in caplog.text


def test_a_join_takes_the_way_its_check_finds_and_its_status_says_which(
    logger: NodeLogger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the run's egress, an online writer checks its way to W&B before ``wandb.init``: a
    node without a route sends through the relay (wandb's proxy settings in its spec, never the
    process's environment), or writes offline where that fails too; the status carries the way."""
    from ray_wandb_nodes._config.secrets import Secret
    from ray_wandb_nodes._egress import Endpoint, Reach, Reachability, RelayRoute, Way, WriterEgress

    route = RelayRoute("198.18.0.1", 40123, Secret("tok"))
    outcomes: list[Reach] = []

    def check(url: str, *, proxy: str | None, timeout_s: float) -> Reachability:
        return Reachability(outcomes.pop(0), Endpoint("wandb.corp", 443), proxy, "", 0.0)

    started: list[WriterSpec] = []
    brought_in: list[bool] = []  # each writer's log brought in at the run's end (so flushed each second)
    monkeypatch.setattr("ray_wandb_nodes._egress.way.check_reach", check)

    def init(spec: WriterSpec, *, log_brought_in: bool = False, **_: Any) -> Run:
        started.append(spec)
        brought_in.append(log_brought_in)
        return Run()

    monkeypatch.setattr(node_logger, "init_writer", init)
    online = {"base_url": "https://wandb.corp", "mode": "shared"}
    outcomes[:] = [Reach.UNREACHABLE, Reach.REACHABLE]
    status = logger.add_writer(WriterSpec(Role.NODE, "node-a", {"id": "run-1"}, online), WriterEgress(route=route))
    assert status.egress["run-1"].way is Way.RELAY
    assert started[-1].settings["https_proxy"] == route.proxy_url()
    assert "https_proxy" not in {k.lower() for k in __import__("os").environ}
    outcomes[:] = [Reach.TIMED_OUT, Reach.REFUSED]
    status = logger.add_writer(WriterSpec(Role.NODE, "node-a", {"id": "run-2"}, online), WriterEgress(route=route))
    assert status.egress["run-2"].way is Way.OFFLINE and started[-1].settings["mode"] == "offline"
    outcomes[:] = []  # an offline run's writer, and a writer without egress, are not checked
    status = logger.add_writer(spec("run-3"), WriterEgress(route=route))
    logger.add_writer(WriterSpec(Role.NODE, "node-a", {"id": "run-4"}, {"mode": "offline"}), WriterEgress())
    assert "run-3" not in status.egress and started[-1].settings == {"mode": "offline"}
    outcomes[:] = [Reach.REACHABLE]
    status = logger.add_writer(WriterSpec(Role.NODE, "node-a", {"id": "run-5"}, online), WriterEgress(route=route))
    assert status.egress["run-5"].way is Way.DIRECT
    assert brought_in == [True, True, True, False]  # relayed, offline, offline, straight
