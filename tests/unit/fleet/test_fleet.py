"""The node fleet without Ray actors: how runs end, and what a run target wants."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ray_wandb_nodes._config.values import NodeSelection
from ray_wandb_nodes._fleet.collect import CollectJob, OfflineCollection
from ray_wandb_nodes._fleet.commands import Poll, RankReport
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.plan import RunWants
from ray_wandb_nodes._fleet.pool import LoggerHandle, LoggerPool
from ray_wandb_nodes._fleet.retire import Retirement, advance_all
from ray_wandb_nodes._fleet.targets import StandaloneTarget
from ray_wandb_nodes._wandb.writers import Role, WriterSpec
from ray_wandb_nodes._warn import Warner
from tests.support.fakes import logger_status, summary
from tests.support.fleets import one_node_pool, simulated_fleet


def retirement(run_id: str, **fields: Any) -> Retirement:
    return Retirement(
        run_id=run_id, refs={}, deadline=0.0, timeout=1.0, then=None, writers_done=threading.Event(), **fields
    )


def test_a_run_whose_end_fails_does_not_hold_the_other_runs_ends(caplog: pytest.LogCaptureFixture) -> None:
    class RefusingIndex:
        folder = "/nowhere"

        def set_writer(self, entry: dict[str, Any]) -> None:
            raise RuntimeError("the index refused")

    warner = Warner()
    handle = LoggerHandle(node=NodeInfo("a" * 56, "host", "10.0.0.1"), actor=None, pg=None)
    ended: list[str] = []
    # Its collection is over; recording what was left fails.
    job = CollectJob(run_id="run-a", index=RefusingIndex(), role=Role.NODE, sources=[handle])  # type: ignore[arg-type]
    failing = retirement("run-a", job=job, collecting=True)
    fine = retirement("run-b")
    fine.then = lambda: ended.append("run-b")
    pool = LoggerPool(init_timeout_s=1.0, warner=warner, ping_s=1.0)
    still = advance_all([failing, fine], pool, OfflineCollection(warner), warner, final=False)
    assert ended == ["run-b"] and still == []
    assert "ending the W&B run run-a failed (RuntimeError: the index refused)" in caplog.text
    # Whoever waits on either run's end is released.
    assert failing.writers_done.is_set() and fine.writers_done.is_set()


def test_a_standalone_run_wants_its_one_node_and_is_ready_at_once() -> None:
    spec = WriterSpec(role=Role.RUN, label="rank-0", init_kwargs={"id": "base-rank-0"}, settings={})
    target = StandaloneTarget(writer=spec, nodes={"n1"})
    assert target.ready and target.role is Role.RUN and target.index is None
    assert target.wants() == RunWants("base-rank-0", NodeSelection.WORKERS, frozenset({"n1"}), None)
    assert target.wants(["n2"]).nodes == frozenset({"n1", "n2"})
    assert target.spec(NodeInfo("n1", "h", "")) is spec


# the fleet's cost at scale, with simulated nodes and loggers (bench/fleet_scale.py's) -----------
def test_the_node_listing_is_read_at_most_once_a_poll_whatever_the_commands() -> None:
    from ray_wandb_nodes._fleet.fleet import POLL_S

    fleet, sim, target = simulated_fleet(20)
    for _ in range(200):  # a burst of rank reports: each one a turn of the fleet thread
        fleet.step(RankReport(target.run_id, [{"x": 1.0}], 0.0))
    assert sim.listings == 1
    sim.clock.now += POLL_S
    fleet.step(Poll())
    assert sim.listings == 2


def test_pings_go_in_bounded_batches_and_reach_every_logger() -> None:
    from ray_wandb_nodes._fleet.fleet import POLL_S
    from ray_wandb_nodes._fleet.pool import PING_BATCH

    n = 3 * PING_BATCH + 10
    fleet, sim, _ = simulated_fleet(n)
    pool = fleet.worker.pool
    calls: list[int] = []
    for _ in range(6):
        before = sum(h.pinged > 0 for h in pool.handles())
        sim.clock.now += POLL_S
        fleet.step(Poll())
        calls.append(sum(h.pinged > 0 for h in pool.handles()) - before)
    assert max(calls) <= PING_BATCH
    assert all(h.pinged > 0 for h in pool.handles())  # every logger within ceil(n / batch) ticks
    assert all(h.summary is not None for h in pool.handles())


def test_past_the_cap_members_and_observers_cover_every_node_and_one_warning_says_so() -> None:
    from bench.fleet_scale import run_minutes

    fleet, sim, target = simulated_fleet(300, cap=40)
    run_minutes(fleet, sim, 1, 0.0, {})
    hosted = {h.node.node_id: set(h.runs) for h in fleet.worker.pool.handles()}
    members = {n for n, runs in hosted.items() if target.run_id in runs}
    observers = {n for n, runs in hosted.items() if f"{target.run_id}--observer" in runs}
    assert len(members) == 40 and len(observers) == 260 and not members & observers
    assert [w for w in fleet._warner.said if "max_node_writers=40" in w] == [
        f"the W&B run {target.run_id} uses 300 nodes, more than max_node_writers=40: 40 of them write to it "
        "(each kind of node, the lowest ranks and any straggler first); the other 260 are observed only, "
        "their latest samples in the run's nodes table every minute"
    ]
    table = target.health.table()
    assert len(table) == 300 and sum(row[4] == "table only" for row in table) == 260


def test_each_tune_trials_table_sees_its_own_writers_samples_on_a_shared_node() -> None:
    import datetime as dt
    from types import SimpleNamespace

    from ray_wandb_nodes._fleet.health import feed
    from ray_wandb_nodes._fleet.hosted import HostedRun
    from ray_wandb_nodes._fleet.node_logger import NodeLogger
    from ray_wandb_nodes._fleet.targets import SharedTarget
    from ray_wandb_nodes._health import HealthMonitor, HealthOptions
    from ray_wandb_nodes._health.monitor import COLUMNS

    now = dt.datetime.now(tz=dt.timezone.utc)

    class Writer:  # what the reader reads off a wandb run: its kept samples
        def __init__(self, cpu: float) -> None:
            self._system_metrics = {"cpu": [(now, cpu)], "proc.memory.rssMB": [(now, cpu * 10)]}

    # Two trials' writers on one node's logger: trial A busy, trial B idle.
    logger = NodeLogger()
    logger._hosted = {key: HostedRun(key, run=Writer(cpu)) for key, cpu in (("trial-a", 90.0), ("trial-b", 5.0))}
    logger.read_samples()
    status = logger_status("n1", 1, ["trial-a", "trial-b"], summaries=logger.summaries())
    node, pool, handle = one_node_pool()
    handle.runs = {"trial-a", "trial-b"}
    pool.check_status(handle, status)
    updated = pool.take_updated()
    cpu: dict[str, Any] = {}
    for run_id in ("trial-a", "trial-b"):
        primary = SimpleNamespace(spec=SimpleNamespace(run_id=run_id), index=None, summary=None)
        target = SharedTarget(primary=primary, nodes={"n1"}, health=HealthMonitor(HealthOptions(compare_all=True)))  # type: ignore[arg-type]
        feed(target, pool, {"n1": node}, {"n1": node}, updated)
        assert target.health is not None
        row = target.health.table()[0]
        cpu[run_id] = (row[COLUMNS.index("cpu")], row[COLUMNS.index("rss_mb")])
    assert cpu == {"trial-a": (90.0, 900.0), "trial-b": (5.0, 50.0)}


def test_a_two_node_job_on_a_big_shared_cluster_starts_two_loggers_ahead() -> None:
    from bench.fleet_scale import prestart

    # 500 nodes of 8 GPUs, half of them held by other jobs; 16 workers of 1 GPU need 2 nodes.
    assert prestart(500, 16, 1.0, 0.5) == {"nodes": 500, "workers": 16, "job_nodes": 2, "loggers": 2}


def test_one_writers_failed_read_never_stops_the_others() -> None:
    import datetime as dt

    from ray_wandb_nodes._fleet.hosted import HostedRun
    from ray_wandb_nodes._fleet.node_logger import NodeLogger

    class Writer:
        _system_metrics = {"cpu": [(dt.datetime.now(tz=dt.timezone.utc), 40.0)]}

    class Broken:  # a writer whose samples cannot be read
        @property
        def _system_metrics(self) -> Any:
            raise RuntimeError("no service")

    logger = NodeLogger()
    failing = type("Failing", (), {"read": lambda self, run: run._system_metrics, "take": lambda self: None})()
    logger._hosted = {
        "broken": HostedRun("broken", run=Broken(), reader=failing),
        "trial-a": HostedRun("trial-a", run=Writer()),
    }
    logger.read_samples()
    assert sorted(logger.summaries()) == ["trial-a"]


def test_one_runs_last_check_leaves_the_new_samples_for_the_other_runs() -> None:
    from types import SimpleNamespace

    from ray_wandb_nodes._fleet.health import FleetHealth
    from ray_wandb_nodes._fleet.targets import SharedTarget
    from ray_wandb_nodes._health import HealthMonitor, HealthOptions

    node, pool, handle = one_node_pool()
    handle.runs = {"trial-a", "trial-b"}
    targets = {}
    for run_id in ("trial-a", "trial-b"):
        primary = SimpleNamespace(spec=SimpleNamespace(run_id=run_id), index=None, summary=None, ready=False)
        targets[run_id] = SharedTarget(primary=primary, nodes={"n1"}, health=HealthMonitor(HealthOptions()))  # type: ignore[arg-type]
    health = FleetHealth(Warner())
    alive = {"n1": node}
    health.check(targets, pool, alive)  # both runs know the node; no samples yet
    summaries = {run_id: summary(1.0, seq=1, cpu=40.0, age_s=0.5) for run_id in targets}
    pool.check_status(handle, logger_status("n1", 1, sorted(targets), summaries=summaries))  # a ping brings them
    health.check({"trial-a": targets["trial-a"]}, pool, alive, only="trial-a", final=True)  # trial A ends first
    health.check({"trial-b": targets["trial-b"]}, pool, alive)  # trial B, at the next tick
    for target in targets.values():
        assert target.health is not None and target.health.table()[0][8] == 40.0  # the cpu column


def test_a_node_s_unreadable_transaction_log_is_one_warning_naming_the_node_and_the_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ray_wandb_nodes._health import Degradation, ReadProblem

    node, pool, handle = one_node_pool()
    bad = ReadProblem(
        Degradation.LOG_UNREADABLE, "checksum mismatch", "/x/run-a.wandb: checksum mismatch at byte offset 32768"
    )
    for ping in range(3):  # every ping carries it: said once
        status = logger_status(
            "n1", 1, ["run-a"], summaries={"run-a": summary(float(ping), cpu=5.0)}, problems={"run-a": (bad,)}
        )
        pool.check_status(handle, status)
    said = [r.getMessage() for r in caplog.records if "transaction log" in r.getMessage()]
    assert len(said) == 1, said
    assert f"the node writer on {node.label} cannot be read" in said[0] and "checksum mismatch" in said[0]
    assert "slow-GPU and memory-error alerts" in said[0]


def test_a_run_s_end_reads_the_node_listing_afresh_and_names_a_node_that_died_since_the_last() -> None:
    """A node Ray marked dead after the fleet's last listing (every ``POLL_S``) and before the run
    ended: the end's own listing finds it, so the run's last judgement names it lost."""
    from ray_wandb_nodes._fleet.commands import Retire
    from ray_wandb_nodes._fleet.fleet import POLL_S
    from ray_wandb_nodes._run.primary_commands import RaiseAlert

    fleet, sim, target = simulated_fleet(3)
    target.selection, target.nodes = "workers", set(sim.alive)  # a Train run's: its ranks' nodes
    target.ranks = {node_id: (rank,) for rank, node_id in enumerate(sim.alive)}
    for _ in range(3):  # the loggers join and report
        sim.clock.now += POLL_S
        fleet.step(Poll())
    dead = next(iter(sim.alive))
    label = next(h.node.label for h in fleet.worker.pool.handles() if h.node.node_id == dead)
    sim.fail(dead)
    listings = sim.listings
    fleet.step(Retire(target.run_id, 5.0, None, 0, threading.Event()))  # within the poll: no listing due
    assert sim.listings == listings + 2  # at the run's end, and at its final judgement
    queued = target.primary._queue  # type: ignore[attr-defined]  # never started: its commands wait there
    commands = [queued.get_nowait() for _ in range(queued.qsize())]
    alerts = [c.alert.title for c in commands if isinstance(c, RaiseAlert)]
    assert alerts == [f"Node lost: {label}"], alerts


def test_a_node_that_dies_while_the_run_s_writers_finish_is_named_in_its_final_judgement() -> None:
    """A host killed with no failure left: its ranks' failure ends the run before Ray knows the
    node dead, so the listing at the run's end still has it; the final judgement, once the
    writers have finished, reads the listing again and names it lost."""
    from ray_wandb_nodes._fleet.commands import Retire
    from ray_wandb_nodes._fleet.fleet import POLL_S
    from ray_wandb_nodes._run.primary_commands import RaiseAlert

    fleet, sim, target = simulated_fleet(3)
    target.selection, target.nodes = "workers", set(sim.alive)
    target.ranks = {node_id: (rank,) for rank, node_id in enumerate(sim.alive)}
    for _ in range(3):
        sim.clock.now += POLL_S
        fleet.step(Poll())
    dead = next(iter(sim.alive))
    label = next(h.node.label for h in fleet.worker.pool.handles() if h.node.node_id == dead)
    listings, list_nodes = sim.listings, sim.list_nodes

    def listing() -> Any:  # Ray marks the node dead right after the run's end read the listing
        records = list_nodes()
        if sim.listings == listings + 1:
            sim.fail(dead)
        return records

    fleet.worker.listing.list_nodes = listing
    done = threading.Event()
    fleet.step(Retire(target.run_id, 5.0, None, 0, done))
    for _ in range(50):  # the writers finish (no poll's listing due: the clock stands still)
        if done.is_set():
            break
        fleet.step(Poll())
    assert done.is_set() and sim.listings == listings + 2  # at the end, and at the final judgement
    queued = target.primary._queue  # type: ignore[attr-defined]
    commands = [queued.get_nowait() for _ in range(queued.qsize())]
    assert [c.alert.title for c in commands if isinstance(c, RaiseAlert)] == [f"Node lost: {label}"]
