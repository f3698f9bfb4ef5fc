"""Node health without Ray or W&B: the straggler rule from a table of series, the summary of
wandb's kept samples, and the monitor's alerts, counts and table."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ray_wandb_nodes._config.values import StragglerMode
from ray_wandb_nodes._health import (
    COLUMNS,
    GpuIntBatch,
    GpuInts,
    GpuSummary,
    HealthMonitor,
    HealthOptions,
    NodeSummary,
    StragglerRule,
    gpu_ints,
    summarize,
)
from ray_wandb_nodes._health.rule import NodeStreak, judge
from tests.support.fakes import Clock, summary

# Each case: rule, and a series of ticks {node: value} one second apart (every node fresh each
# tick, one sample each); the events expected as (tick index, node, event).
RULE_CASES: list[tuple[str, StragglerRule, list[dict[str, float]], list[tuple[int, str, str]]]] = [
    (
        "balanced nodes: nothing",
        StragglerRule(window_s=2),
        [{"a": 100, "b": 98, "c": 103}] * 8,
        [],
    ),
    (
        "one node at a third, from the start: flagged once, after the window and 3 samples",
        StragglerRule(window_s=2),
        [{"a": 100, "b": 100, "c": 33}] * 8,
        [(2, "c", "straggler")],
    ),
    (
        "the window decides when the samples come fast",
        StragglerRule(window_s=5),
        [{"a": 100, "b": 100, "c": 33}] * 8,
        [(5, "c", "straggler")],
    ),
    (
        "just above the threshold is not worse",
        StragglerRule(threshold=0.7, window_s=1),
        [{"a": 100, "b": 100, "c": 71}] * 6,
        [],
    ),
    (
        "a dip shorter than the window: nothing",
        StragglerRule(window_s=3),
        [{"a": 100, "b": 100, "c": 100}, *[{"a": 100, "b": 100, "c": 20}] * 3, *[{"a": 100, "b": 100, "c": 100}] * 4],
        [],
    ),
    (
        "a straggler that comes back recovers after as long",
        StragglerRule(window_s=2),
        [*[{"a": 100, "b": 100, "c": 30}] * 4, *[{"a": 100, "b": 100, "c": 99}] * 4],
        [(2, "c", "straggler"), (6, "c", "recovered")],
    ),
    (
        "min mode: a step time above median / threshold is worse",
        StragglerRule(mode=StragglerMode.MIN, threshold=0.5, window_s=2),
        [{"a": 1.0, "b": 1.1, "c": 2.5}] * 4,
        [(2, "c", "straggler")],
    ),
    (
        "min mode: below the bound is fine",
        StragglerRule(mode=StragglerMode.MIN, threshold=0.5, window_s=2),
        [{"a": 1.0, "b": 1.1, "c": 1.9}] * 4,
        [],
    ),
    (
        "two nodes: each compares to the other, only the low one is worse",
        StragglerRule(window_s=2),
        [{"a": 100, "b": 40}] * 4,
        [(2, "b", "straggler")],
    ),
    (
        "a floor: idle nodes differing by noise are never worse",
        StragglerRule(mode=StragglerMode.MIN, window_s=1, floor=10),
        [{"a": 0.5, "b": 1.0, "c": 6.0}] * 4,
        [],
    ),
    (
        "one node alone has nobody to compare with",
        StragglerRule(window_s=1),
        [{"a": 1.0}] * 4,
        [],
    ),
]


@pytest.mark.parametrize(("rule", "ticks", "expected"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_the_straggler_rule(
    rule: StragglerRule, ticks: list[dict[str, float]], expected: list[tuple[int, str, str]]
) -> None:
    streaks: dict[str, NodeStreak] = {}
    got = []
    for i, values in enumerate(ticks):
        got += [(i, node, event) for node, event in judge(rule, streaks, values, dict.fromkeys(values, 1), float(i))]
    assert got == expected


def test_samples_count_as_many_as_they_stand_for() -> None:
    # One summary standing for 3 samples counts as 3; the window still has to pass.
    rule = StragglerRule(window_s=2)
    streaks: dict[str, NodeStreak] = {}
    values = {"a": 100.0, "b": 100.0, "c": 10.0}
    assert judge(rule, streaks, values, {"c": 3}, 0.0) == []
    assert judge(rule, streaks, values, {"c": 3}, 2.0) == [("c", "straggler")]


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(1_800_000_000 + seconds, tz=dt.timezone.utc)


def test_a_summary_of_kept_samples_is_small_and_only_new() -> None:
    series: dict[str, list[tuple[Any, Any]]] = {
        "cpu": [(at(0), 10.0), (at(1), 30.0)],
        "memory_percent": [(at(1), 50.0)],
        "proc.memory.rssMB": [(at(1), 700.0)],
        "network.sent": [(at(0), 1000.0), (at(1), 3000.0)],
        "gpu.1.gpu": [(at(1), 40.0)],
        "gpu.0.gpu": [(at(0), 80.0), (at(1), 100.0)],
        "gpu.0.memoryAllocated": [(at(1), 25.0)],
        "gpu.1.memoryAllocated": [(at(1), 75.0)],
        "gpu.0.temp": [(at(1), 60.0)],
        "gpu.0.powerWatts": [(at(0), 400.0), (at(1), 500.0)],
        "gpu.0.enforcedPowerLimitWatts": [(at(0), 700.0), (at(1), 650.0)],  # the newest limit
        "gpu.0.powerPercent": [(at(1), 71.0)],  # not summarised
        "disk./.usagePercent": [(at(1), float("nan"))],
    }
    s = summarize(series)
    assert s == NodeSummary(
        t0=at(0).timestamp(),
        t=at(1).timestamp(),
        n=2,  # sampling intervals: the most points of one series
        cpu=20.0,
        mem=50.0,
        rss_mb=700.0,
        net_sent=3000.0,  # a counter: the newest
        gpus={  # by NVML index
            0: GpuSummary(util=90.0, mem=25.0, temp=60.0, power=450.0, limit=650.0),
            1: GpuSummary(util=40.0, mem=75.0),
        },
    )
    assert s is not None and list(s.gpus) == [0, 1]
    assert summarize(series, since=at(1).timestamp()) is None
    assert summarize({"cpu": [(at(2), 5.0), ("bad",), (at(3), True)]}, since=at(1).timestamp()) == NodeSummary(
        t0=at(2).timestamp(), t=at(2).timestamp(), n=1, cpu=5.0
    )


def test_gpu_records_sent_apart_from_the_system_ones_count_one_interval_each() -> None:
    # wandb sends a GPU record and a system record each interval, at their own times.
    series = {
        "cpu": [(at(0), 10.0), (at(1), 10.0), (at(2), 10.0)],
        "gpu.0.gpu": [(at(0.01), 90.0), (at(1.01), 90.0), (at(2.01), 90.0)],
    }
    s = summarize(series)
    assert s is not None and s.n == 3


def test_the_integer_gpu_series_come_from_stats_records() -> None:
    stats = [
        (10.0, {"gpu.0.smClock": 1980, "gpu.0.uncorrectedMemoryErrors": 0, "gpu.0.correctedMemoryErrors": 2}),
        (11.0, {"gpu.0.smClock": 1000, "gpu.0.uncorrectedMemoryErrors": 3, "gpu.1.smClock": 1900, "cpu": 5.0}),
        (12.0, {"gpu.99.smClock": "n/a", "gpu.1.memoryClock": 2619}),
    ]
    assert gpu_ints(stats) == GpuIntBatch(
        t0=10.0, t=11.0, n=2, by={0: GpuInts(sm=1490.0, ecc_u=3.0, ecc_c=2.0, ecc_u0=0.0), 1: GpuInts(sm=1900.0)}
    )
    assert gpu_ints([(1.0, {"cpu": 3.0})]) is None


NODES = {"n0": ("node-h0-aaaaaa", "h0"), "n1": ("node-h1-bbbbbb", "h1"), "n2": ("node-h2-cccccc", "h2")}
RANKS = {"n0": (0,), "n1": (1,), "n2": (2, 3)}


def monitor(**options: Any) -> tuple[HealthMonitor, Clock]:
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=2, table_every_s=60, **options), clock=clock)
    m.set_nodes({**NODES, "head": ("node-head-dddddd", "head")}, RANKS)
    return m, clock


def test_the_metric_rule_takes_the_median_of_a_nodes_ranks_and_alerts_once() -> None:
    m, clock = monitor(metric="perf/samples_per_s")
    for _ in range(5):
        clock.now += 1
        m.report([{"perf": {"samples_per_s": v}} for v in (100, 101, 35, 30)])
    result = m.tick()
    assert [(a.title, a.level, a.kind) for a in result.alerts] == [("Straggler: node-h2-cccccc", "WARN", "straggler")]
    text = result.alerts[0].text
    assert "host h2" in text and "ranks 2,3" in text and "perf/samples_per_s 32.5" in text and "median 100.5" in text
    assert result.stragglers == 1
    clock.now += 5
    again = m.tick()
    assert again.alerts == [] and again.stragglers is None  # nothing new: nothing said
    rows = {row[0]: row for row in m.table()}
    assert rows["node-h2-cccccc"][3] == "straggler" and rows["node-head-dddddd"][2] == ""


def test_the_system_rule_compares_gpus_with_gpus_and_cpus_with_cpus() -> None:
    m, clock = monitor()
    for i in range(5):
        clock.now += 1
        t = clock.now
        m.summary("n0", summary(t, seq=i + 1, gpus={0: GpuSummary(util=95.0), 1: GpuSummary(util=97.0)}))
        m.summary("n1", summary(t, seq=i + 1, gpus={0: GpuSummary(util=20.0), 1: GpuSummary(util=30.0)}))
        m.summary("n2", summary(t, seq=i + 1, cpu=400.0))  # no GPU: not compared with GPUs
        m.summary("head", summary(t, seq=i + 1, gpus={0: GpuSummary(util=0.0)}))  # no ranks: left out
        result = m.tick()
        if i < 2:
            assert result.alerts == []
    # n1 (GPU) against n0 alone: 25 < 0.7 x 96. n2 has no CPU peer: nothing.
    titles = [a.title for a in m.raised]
    assert titles == ["Straggler: node-h1-bbbbbb"]
    assert "GPU utilisation (%) 25" in m.raised[0].text


def test_a_lost_node_is_one_alert_and_never_a_straggler() -> None:
    m, clock = monitor(metric="x")
    for _ in range(4):
        clock.now += 1
        m.report([{"x": 100}, {"x": 10}, {"x": 100}, {"x": 100}])
    m.alive(["n0", "n2", "head"])  # it dies before the tick that would have called it a straggler
    clock.now += 1
    m.alive(["n0", "n2", "head"])  # still gone: said once
    # Train moves the run off the dead node: it stays lost, in the table.
    m.set_nodes({k: v for k, v in NODES.items() if k != "n1"}, {"n0": (0,), "n2": (1, 2, 3)})
    result = m.tick(final=True)
    assert [(a.title, a.level) for a in result.alerts] == [("Node lost: node-h1-bbbbbb", "ERROR")]
    assert "rank 1" in result.alerts[0].text  # its ranks when it was lost
    assert result.stragglers == 0
    rows = {row[0]: row[3] for row in result.table or []}
    assert rows == {
        "node-h0-aaaaaa": "ok",
        "node-h1-bbbbbb": "lost",
        "node-h2-cccccc": "ok",
        "node-head-dddddd": "left",
    }


def test_a_straggler_that_dies_is_counted_out() -> None:
    m, clock = monitor(metric="x")
    for _ in range(4):
        clock.now += 1
        m.report([{"x": 100}, {"x": 10}, {"x": 100}, {"x": 100}])
    assert (m.tick().stragglers, [a.kind for a in m.raised]) == (1, ["straggler"])
    m.alive(["n0", "n2", "head"])
    result = m.tick()
    assert ([a.kind for a in result.alerts], result.stragglers) == (["lost"], 0)


def test_a_node_the_run_left_long_before_it_died_is_not_lost() -> None:
    m, clock = monitor()
    m.set_nodes({k: v for k, v in NODES.items() if k != "n1"}, RANKS)
    clock.now += 600
    m.alive(["n0", "n2"])
    assert m.tick().alerts == []


def test_the_table_comes_every_interval_and_at_the_end() -> None:
    m, clock = monitor()
    assert m.tick().table is None  # not at the start: one interval in
    clock.now += 59
    assert m.tick().table is None
    clock.now += 1
    table = m.tick().table
    assert table is not None and [row[0] for row in table][:3] == ["node-h0-aaaaaa", "node-h1-bbbbbb", "node-h2-cccccc"]
    assert m.tick(final=True).table is not None


def test_alerts_off_keeps_the_verdicts() -> None:
    m, clock = monitor(metric="x", alerts=False)
    for _ in range(4):
        clock.now += 1
        m.report([{"x": 1}, {"x": 100}, {"x": 100}, {"x": 100}])
    assert [a.kind for a in m.tick().alerts] == ["straggler"]  # the fleet warns; it raises no W&B alert
    assert m.options.alerts is False


@pytest.mark.parametrize("seed", range(20))
def test_the_median_of_the_others_matches_the_plain_one(seed: int) -> None:
    import random
    import statistics

    from ray_wandb_nodes._stats import median_without

    rnd = random.Random(seed)
    values = [float(rnd.randint(0, 5)) for _ in range(rnd.randint(2, 9))]  # ties on purpose
    ordered = sorted(values)
    for i, v in enumerate(values):
        assert median_without(ordered, v) == statistics.median(values[:i] + values[i + 1 :])


def test_an_idle_node_that_leaves_without_ever_hosting_a_rank_is_left_not_lost() -> None:
    # nodes="cluster": every alive node is the run's; the autoscaler removes an idle one.
    m, clock = monitor()
    idle = {"idle": ("node-idle-eeeeee", "idle")}
    m.set_nodes({**NODES, **idle}, RANKS)
    clock.now += 5
    m.set_nodes(NODES, RANKS)  # gone from the alive nodes, so from the run's
    m.alive(["n0", "n1", "n2"])
    result = m.tick(final=True)
    assert result.alerts == []
    assert {row[0]: row[3] for row in result.table or []}["node-idle-eeeeee"] == "left"
    # A node that hosted ranks before a restart moved them off it is still lost when it dies.
    m.set_nodes(NODES, {"n0": (0,), "n2": (1, 2, 3)})
    m.set_nodes({k: v for k, v in NODES.items() if k != "n1"}, {"n0": (0,), "n2": (1, 2, 3)})
    m.alive(["n0", "n2"])
    assert [(a.title, a.level) for a in m.tick().alerts] == [("Node lost: node-h1-bbbbbb", "ERROR")]


def test_ages_never_set_a_nodes_clock_against_the_monitors() -> None:
    m, clock = monitor()
    # n0's clock runs an hour ahead of the monitor's: its sample was 2 s old when it was sent.
    m.summary("n0", summary(clock.now + 3600, seq=1, cpu=10.0, age_s=2.0))
    # n1's runs an hour behind, and says no age: its age counts from its arrival.
    m.summary("n1", summary(clock.now - 3600, seq=1, cpu=10.0))
    clock.now += 5
    ages = {row[0]: row[COLUMNS.index("last_sample_age_s")] for row in m.table()}
    assert (ages["node-h0-aaaaaa"], ages["node-h1-bbbbbb"], ages["node-h2-cccccc"]) == (7.0, 5.0, None)
    m.alive(["n1", "n2", "head"])
    alert = m.tick().alerts[0]
    assert alert.title == "Node lost: node-h0-aaaaaa" and "its last sample is 7s old" in alert.text


def test_a_summary_says_its_age_on_the_clock_that_took_it() -> None:
    from ray_wandb_nodes._health.reader import aged

    assert aged(summary(100.0, cpu=1.0), now=103.5) == summary(100.0, cpu=1.0, age_s=3.5)
    assert aged(summary(100.0), now=99.0) == summary(100.0, age_s=0.0)  # never negative
    assert aged(None) is None


# degradation: what node health cannot see, said once --------------------------------------------
@pytest.mark.parametrize(
    ("expects_gpu", "intervals", "gpu_seen", "said"),
    [
        (True, 5, False, True),  # GPUs from Ray, five intervals and no GPU: no NVML there
        (True, 4, False, False),  # too soon: the first samples may hold no GPU yet
        (True, 50, True, False),  # it reported GPUs
        (False, 50, False, False),  # a CPU job's node
    ],
)
def test_a_gpu_job_s_node_reporting_no_gpu_is_told_apart(
    expects_gpu: bool, intervals: int, gpu_seen: bool, said: bool
) -> None:
    from ray_wandb_nodes._health.degradation import reports_no_gpu

    assert reports_no_gpu(expects_gpu, intervals, gpu_seen) is said


def test_a_gpu_job_s_node_without_nvml_is_one_notice_naming_it_and_the_cause() -> None:
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=2, table_every_s=60), clock=clock)
    m.set_nodes(NODES, RANKS, (), {0: ("0",), 1: ("0",), 2: ("0",), 3: ("1",)})  # every rank got a GPU
    notices = []
    for i in range(8):
        clock.now += 1
        m.summary("n0", summary(clock.now, seq=i + 1, cpu=10.0, gpus={0: GpuSummary(util=95.0)}))
        m.summary("n1", summary(clock.now, seq=i + 1, cpu=10.0))  # no GPU ever: NVML missing there
        notices += m.tick().notices
    (notice,) = notices  # once, not every tick
    assert notice.node_id == "n1" and notice.kind == "no-gpu"
    assert "node-h1-bbbbbb (host h1, rank 1)" in notice.text and "no libnvidia-ml.so.1" in notice.text
    assert "judges it by its CPU share" in notice.text


def test_a_log_that_is_not_wandb_s_format_is_a_problem_the_reader_keeps(tmp_path: Any) -> None:
    import os
    from types import SimpleNamespace

    from ray_wandb_nodes._health import Degradation, SummaryReader

    log = tmp_path / "run-x.wandb"
    log.write_bytes(os.urandom(3 * 32 * 1024))  # three blocks of bytes that are not the format
    run = SimpleNamespace(_system_metrics={"cpu": [(at(0), 10.0)]}, settings=SimpleNamespace(sync_file=str(log)))
    reader = SummaryReader()
    got = reader.read(run)
    assert got is not None and got.cpu == 10.0  # the kept samples still come
    (problem,) = reader.problems.values()
    assert problem.kind is Degradation.LOG_UNREADABLE
    assert problem.cause == "not a W&B transaction log (no ':W&B' header)" and str(log) in problem.detail
