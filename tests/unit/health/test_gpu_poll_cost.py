"""What node health costs the controller: a poll of the GPU rules grows with the nodes whose
summaries changed, not with the fleet (``bench/health_cost.py`` measures it at 1,000 nodes), and
the medians the rules read, kept sorted as they change (``gpu_peers``), are those of every judged
GPU as it is now; without the metric rule, only the rank reports the idle rule reads go to the
fleet's thread."""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from ray_wandb_nodes._fleet.commands import Poll, RankReport
from ray_wandb_nodes._health import (
    GpuHealth,
    GpuIntBatch,
    GpuInts,
    GpuInventory,
    GpuSummary,
    HealthMonitor,
    HealthOptions,
    NodeSummary,
)
from ray_wandb_nodes._health.gpu_idle import idle_verdicts
from ray_wandb_nodes._health.gpu_peers import Peers
from ray_wandb_nodes._health.gpu_slow import others_medians
from tests.support.fakes import busy_node

GPUS = 8


def node_id(i: int) -> str:
    return f"{i:056x}"


@contextmanager
def python_calls() -> Iterator[list[int]]:
    """Counts the Python function calls made inside the block (a deterministic measure of work)."""
    count = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


def fleet(n: int) -> tuple[GpuHealth, set[str], Callable[[int, int], None]]:
    """``n`` busy nodes of 8 GPUs, a rank a GPU, each summary judged once; and ``feed(node, poll)``."""
    health = GpuHealth(0.7, 30.0)
    live = {node_id(i) for i in range(n)}
    for i in range(n):
        health.ranks(node_id(i), {GPUS * i + g: (str(g),) for g in range(GPUS)})

    def feed(i: int, poll: int) -> None:
        t = 1.8e9 + 3.0 * poll
        s = busy_node(random.Random(i * 7919 + poll), i, t, seq=poll, batches=[(t - 15.0, t, 6)])
        health.update(node_id(i), s)

    for i in range(n):
        feed(i, 1)
    health.judge(live)
    return health, live, feed


def test_a_poll_where_one_node_changed_costs_the_same_at_20_and_at_400_nodes() -> None:
    calls = {}
    for n in (20, 400):
        health, live, feed = fleet(n)
        feed(3, 2)  # one node's new summary: every GPU's readings and a log block
        with python_calls() as count:
            health.judge(live)
        calls[n] = count[0]
    # Rebuilding the medians (and looking at every node) made 20x the nodes cost ~20x the calls.
    assert calls[400] <= calls[20] + 5, calls


def test_the_node_rule_works_out_again_only_the_values_of_nodes_that_changed() -> None:
    monitor = HealthMonitor(HealthOptions(window_s=30.0), clock=lambda: 1.8e9)
    n = 50
    names = {node_id(i): (f"node-{i}", f"host{i}") for i in range(n)}
    ranks = {node_id(i): range(GPUS * i, GPUS * (i + 1)) for i in range(n)}
    monitor.set_nodes(names, ranks, rank_gpus={r: (str(r % GPUS),) for r in range(GPUS * n)})

    def feed(i: int, poll: int) -> None:
        t = 1.8e9 + 3.0 * poll
        monitor.summary(node_id(i), busy_node(random.Random(i + 1000 * poll), i, t, seq=poll))

    for i in range(n):
        feed(i, 1)
    monitor.tick()
    monitor.tick()  # each node's kind ("gpu:<model>") is known from the first
    asked: list[str] = []
    judged_indices = monitor.gpus.judged_indices

    def counted(node: str) -> tuple[int, ...] | None:
        asked.append(node)
        return judged_indices(node)

    monitor.gpus.judged_indices = counted  # type: ignore[method-assign]
    feed(7, 2)
    monitor.tick()
    assert asked == [node_id(7)]  # was: all 50, each tick
    asked.clear()
    monitor.tick()  # nothing new
    assert asked == []


def test_the_medians_kept_are_those_of_every_judged_gpu_as_it_is_now() -> None:
    # Nodes come and go from the judged set, ranks move, GPUs fall off the bus and come back,
    # clocks and utilisation change: each poll, the medians the rules used are what the rules'
    # own functions make of every judged GPU of the live nodes (the rebuild that no longer runs).
    rnd = random.Random(5)
    health = GpuHealth(0.7, 6.0, min_samples=2)
    n, per = 12, 4
    live = {node_id(i) for i in range(n)}
    checked = 0
    for poll in range(80):
        if rnd.random() < 0.1:
            i = rnd.randrange(n)
            health.ranks(node_id(i), {per * i + g: (str(g),) for g in range(rnd.randint(0, per))})
        if rnd.random() < 0.1:
            live ^= {node_id(rnd.randrange(n))}
        fed = set()  # (node, GPU) that brought readings now
        for i in rnd.sample(range(n), rnd.randint(1, n)):
            t = 1000.0 + 3.0 * poll
            shown = [g for g in range(per) if not (g == 1 and i % 3 == 0 and 10 <= poll < 30)]  # off the bus
            fed |= {(node_id(i), g) for g in shown}
            utils = {g: GpuSummary(rnd.choice([0.0, 3.0, 60.0, 99.0, 100.0]), 40.0) for g in shown}
            blocks = {g: GpuInts(sm=c, busy_sm=c, busy_util=u) for g in shown for c, u in [_clock(rnd)]}
            health.update(node_id(i), _summary(t, poll, utils, blocks))
        health.judge(live)
        alive = [g for g in health.gpus_of(live) if g.ranks and not g.lost.flagged]  # every GPU judged
        idle = idle_verdicts({id(g): g.util for g in alive if g.util is not None})
        slow = others_medians({id(g): (g.model, g.busy_util, g.busy_sm) for g in alive})
        for gpu in (g for g in alive if (g.node_id, g.index) in fed):  # judged now
            assert (gpu.idle.median, gpu.slow.median) == (idle[id(gpu)][1], slow[id(gpu)])
            checked += 1
    assert checked > 300


def _clock(rnd: random.Random) -> tuple[float | None, float | None]:
    if rnd.random() < 0.2:
        return None, None  # no busy sample in the block
    return rnd.choice([1980.0, 1960.0, 900.0]), rnd.choice([60.0, 100.0])


def _summary(t: float, seq: int, gpus: dict[int, GpuSummary], blocks: dict[int, GpuInts]) -> NodeSummary:
    models = tuple("A" if g % 2 else "B" for g in range(4))
    info = GpuInventory(models, tuple(f"GPU-{g}" for g in range(4)))
    return NodeSummary(t0=t, t=t, n=1, seq=seq, gpus=gpus, gpu_ints=(GpuIntBatch(t - 2, t, 2, blocks),), gpu_info=info)


def test_peers_keep_each_group_sorted_whether_few_or_many_values_move() -> None:
    rnd = random.Random(11)
    peers: Peers[int] = Peers()
    held: dict[tuple[str, int], tuple[float, ...]] = {}
    for _ in range(300):
        for key in rnd.sample(range(40), rnd.choice([1, 2, 30])):  # few moves: bisected; many: sorted afresh
            for group in "ab":
                values = tuple(rnd.choice([1.0, 2.0, 2.0, 7.5]) for _ in range(rnd.randint(0, 3)))
                peers.set(group, key, values)
                held[group, key] = values
        for group in "ab":
            assert list(peers.ordered(group)) == sorted(v for (g, _), vs in held.items() if g == group for v in vs)
    peers.set("a", 99, (math.nan,))  # a value that does not compare: taken out again by a fresh sort
    peers.set("a", 99, ())
    assert list(peers.ordered("a")) == sorted(v for (g, _), vs in held.items() if g == "a" for v in vs)


def _sent(fleet: Any) -> list[tuple[float, bool, int]]:
    """The rank reports the controller put on the fleet's queue (each: time, checkpoint, metrics
    held), the fleet thread's turns taken."""
    sent = []
    while not fleet._commands.empty():
        command = fleet._commands.get_nowait()
        if isinstance(command, RankReport):
            sent.append((command.at, command.checkpoint, len(command.metrics)))
        fleet.step(command)
    return sent


def test_without_a_metric_rule_only_the_reports_the_idle_rule_reads_go_to_the_fleet(monkeypatch: Any) -> None:
    from ray_wandb_nodes._run import session as _session
    from tests.support.fleets import simulated_fleet

    fleet, _, target = simulated_fleet(2)
    ticks = iter(range(100, 1000))
    monkeypatch.setattr(_session, "time", SimpleNamespace(time=lambda: float(next(ticks)), monotonic=time.monotonic))
    session = _session.SharedSession(target, target.primary, fleet, 1.0)
    ranks = [{"loss": 1.0}, {"loss": 2.0}]
    for _ in range(10):
        session.report_ranks(ranks)
    session.report_ranks(ranks, checkpoint=True)
    # the first report (set-up over), then the checkpoint's with the one before it (the save
    # began there): was all 11, a queue put each on the controller
    assert _sent(fleet) == [(100.0, False, 0), (109.0, False, 0), (110.0, True, 0)]
    for _ in range(5):
        session.report_ranks(ranks)
    assert _sent(fleet) == []
    session.set_nodes({"n0"}, ranks={"n0": (0, 1)}, rank_gpus={0: ("0",), 1: ("1",)})  # a restart
    session.report_ranks(ranks)
    session.report_ranks(ranks)
    assert [at for at, _, _ in _sent(fleet)] == [116.0]  # the new worker group's first report
    target.health.gpus.ranks("a node learnt of later", {7: ("0",)})  # the monitor waits for its ranks' report
    fleet.step(Poll())  # the fleet thread tells the run's hooks so
    session.report_ranks(ranks)
    assert [at for at, _, _ in _sent(fleet)] == [118.0]
    session.report_ranks(ranks)  # taken: no longer waited for
    assert _sent(fleet) == []


def test_with_the_metric_rule_every_report_goes_to_the_fleet_with_its_metrics(monkeypatch: Any) -> None:
    from ray_wandb_nodes._run import session as _session
    from tests.support.fleets import simulated_fleet

    fleet, _, target = simulated_fleet(2)
    target.health.options = HealthOptions(metric="loss")
    session = _session.SharedSession(target, target.primary, fleet, 1.0)
    for _ in range(4):
        session.report_ranks([{"loss": 1.0}, {"loss": 2.0}])
    assert [(c, n) for _, c, n in _sent(fleet)] == [(False, 2)] * 4
