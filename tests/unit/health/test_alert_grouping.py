"""Alert storms, through the monitor on the shared fakes: one cause is one alert (a node's GPUs,
many nodes with one verdict), a flapping GPU is one alert and one recovery an episode, the
tables are logged at most once a ``table_every_s`` of (fake) time, and the ``gpus`` table's
row for what it leaves out counts it by state."""

from __future__ import annotations

from typing import Any

from ray_wandb_nodes._health import EventKind, GpuInts, HealthMonitor, HealthOptions, TickResult
from ray_wandb_nodes._health.alert_groups import LIST_LIMIT, gpu_span
from ray_wandb_nodes._health.table import TABLE_CAP
from tests.support.fakes import clocks, gpus, inventory, summary

EIGHT = tuple(range(8))


class Fleet:
    """``count`` 8-GPU nodes ``n0``.. of one job (8 ranks each), one summary a node a tick of 3 s."""

    def __init__(self, count: int, **options: Any) -> None:
        self.now = 1000.0
        self.m = HealthMonitor(HealthOptions(window_s=6, **options), clock=lambda: self.now)
        self.ids = [f"n{i}" for i in range(count)]
        ranks = {n: tuple(range(8 * i, 8 * i + 8)) for i, n in enumerate(self.ids)}
        rank_gpus = {r: (str(r % 8),) for rs in ranks.values() for r in rs}
        self.m.set_nodes({n: (f"node-{n}-abcdef", n) for n in self.ids}, ranks, (), rank_gpus)
        self.seq = 0

    def tick(
        self,
        present: dict[str, tuple[int, ...]] | None = None,
        ints: dict[str, dict[int, GpuInts]] | None = None,
        final: bool = False,
    ) -> TickResult:
        """One interval: each node's GPUs ``present`` (default all 8) at 97 %, and its clocks."""
        self.now += 3
        self.seq += 1
        for n in self.ids:
            shown = (present or {}).get(n, EIGHT)
            self.m.summary(
                n,
                summary(
                    self.now,
                    seq=self.seq,
                    cpu=50.0,
                    gpus={i: g for i, g in gpus([97.0] * 8).items() if i in shown},
                    info=inventory(8, n),
                    ints={i: c for i, c in ((ints or {}).get(n) or clocks(8)).items() if i in shown},
                ),
            )
        return self.m.tick(final=final)


def lose(fleet: Fleet, nodes: list[str], ticks: int) -> list[TickResult]:
    """``nodes`` lose all 8 GPUs (every reading gone) while they sample on."""
    return [fleet.tick({n: () for n in nodes}) for _ in range(ticks)]


def test_600_lost_gpus_are_one_error_alert_naming_the_nodes_and_counting_the_rest() -> None:
    fleet = Fleet(80)
    for _ in range(3):
        fleet.tick()
    lost = fleet.ids[:75]
    results = lose(fleet, lost, 10)
    alerts = [a for r in results for a in r.alerts]
    said = [(a.title, a.level, a.kind) for a in alerts]
    assert said == [("GPU lost: 75 nodes, 600 GPUs", "ERROR", EventKind.GPU_LOST)]
    (alert,) = alerts
    lines = alert.text.splitlines()
    assert lines[0] == "GPU lost on 75 nodes, 600 GPUs at once:"
    assert lines[1 : 1 + LIST_LIMIT] == [f"- node-{n}-abcdef GPUs 0-7" for n in lost[:LIST_LIMIT]]  # as they came
    assert lines[1 + LIST_LIMIT] == f"- and {75 - LIST_LIMIT} more nodes ({8 * (75 - LIST_LIMIT)} GPUs)"
    assert lines[2 + LIST_LIMIT].startswith("The first of them in full: 8 GPUs of node-n")
    assert sum("stopped reporting while its node samples on" in line for line in lines) == 8  # one node's, in full
    # not delayed: said at the very tick the rule found the GPUs lost
    at = next(i for i, r in enumerate(results) if r.alerts)
    assert all(fleet.m.gpus.not_ok(n) == ", ".join(f"GPU {i} lost" for i in EIGHT) for n in lost)
    assert at == 0 or not any(a.kind is EventKind.GPU_LOST for r in results[:at] for a in r.alerts)


def test_one_node_s_lost_gpus_are_one_alert_naming_its_gpus_and_each_one() -> None:
    fleet = Fleet(4)
    for _ in range(3):
        fleet.tick()
    alerts = [a for r in lose(fleet, ["n2"], 10) for a in r.alerts]
    assert [(a.title, a.level) for a in alerts] == [("GPU lost: node-n2-abcdef GPUs 0-7", "ERROR")]
    lines = alerts[0].text.splitlines()
    assert lines[0] == "8 GPUs of node-n2-abcdef at once:"
    assert [line.split(" (")[0] for line in lines[1:]] == [f"GPU {i}" for i in EIGHT]
    assert "rank 16)" in lines[1] and "rank 23)" in lines[8]


def test_one_lost_gpu_keeps_its_own_title() -> None:
    fleet = Fleet(4)
    for _ in range(3):
        fleet.tick()
    alerts = [a for _ in range(10) for a in fleet.tick({"n1": (0, 1, 2, 4, 5, 6, 7)}).alerts]
    assert [(a.title, a.level) for a in alerts] == [("GPU lost: node-n1-abcdef GPU 3", "ERROR")]
    assert "GPU 3 (NVIDIA H100 80GB HBM3) of node-n1-abcdef (host n1, rank 11)" in alerts[0].text


def test_nodes_lost_at_once_are_one_error_alert_in_that_tick() -> None:
    fleet = Fleet(50)
    for _ in range(3):
        fleet.tick()
    fleet.m.alive(fleet.ids[45:])  # a rack of 45 gone between two ticks
    (alert,) = fleet.tick().alerts
    assert (alert.title, alert.level, alert.kind) == ("Node lost: 45 nodes", "ERROR", EventKind.NODE_LOST)
    lines = alert.text.splitlines()
    assert lines[1 : 1 + LIST_LIMIT] == [f"- node-{n}-abcdef" for n in fleet.ids[:LIST_LIMIT]]
    assert lines[1 + LIST_LIMIT] == f"- and {45 - LIST_LIMIT} more nodes"
    assert "node-n0-abcdef (host n0, ranks 0,1,2,3,4,5,6,7) left the cluster" in lines[-1]


def test_gpu_indices_are_said_in_short() -> None:
    assert [gpu_span(g) for g in [(3,), (0, 1, 2, 3), (7, 0, 2, 5, 6)]] == ["3", "0-3", "0,2,5-7"]


def flap(fleet: Fleet, times: int) -> list[TickResult]:
    """GPU 3 of n1 around the slow threshold: 4 intervals at 900 MHz, 4 back at 1980 (each
    long enough for the rule to flag it, then to clear it)."""
    out = []
    for _ in range(times):
        out += [fleet.tick(ints={"n1": clocks(8, g3=900.0)}) for _ in range(4)]
        out += [fleet.tick() for _ in range(4)]
    return out


def titles(results: list[TickResult]) -> list[str]:
    return [a.title for r in results for a in r.alerts]


def test_a_flapping_gpu_is_one_alert_and_one_recovery_an_episode() -> None:
    fleet = Fleet(3, hold_s=60)
    assert titles(flap(fleet, 6)) == ["Slow GPU: node-n1-abcdef GPU 3"]  # 6 flaps in 144 s: one episode
    calm = [fleet.tick() for _ in range(20)]  # 60 s back at its clock: the episode is over
    assert titles(calm) == ["Slow GPU recovered: node-n1-abcdef GPU 3"]
    (recovery,) = [a for r in calm for a in r.alerts]
    assert recovery.level == "INFO" and "has recovered: SM clock 1980 MHz against 1980 MHz" in recovery.text
    # the next episode is one alert again; the run's end says its recovery though the hold has not passed
    again = [*flap(fleet, 3), fleet.tick(final=True)]
    assert titles(again) == ["Slow GPU: node-n1-abcdef GPU 3", "Slow GPU recovered: node-n1-abcdef GPU 3"]
    assert [a.title for a in again[-1].alerts] == ["Slow GPU recovered: node-n1-abcdef GPU 3"]


def test_the_tables_are_logged_at_most_once_a_minute_and_at_the_end() -> None:
    fleet = Fleet(40)
    for _ in range(3):
        fleet.tick()
    ints = {n: clocks(8) for n in fleet.ids}
    results = []
    for i, n in enumerate(fleet.ids):  # a new node's GPU 0 with new memory errors every tick: an alert each
        ints[n] = {**ints[n], 0: GpuInts(sm=1980.0, ecc_c=0.0, ecc_u=float(1 + i))}
        results.append((fleet.now + 3, fleet.tick(ints=ints)))
    results.append((fleet.now + 3, fleet.tick(ints=ints, final=True)))
    assert sum(len(r.alerts) for _, r in results) == 40  # 40 nodes, one at a time: an alert each
    tabled = [t for t, r in results if r.table is not None]
    assert all(r.gpu_table is not None for _, r in results if r.table is not None)
    # 120 s of alerts every 3 s: the first alert's table, one a minute on, and the end's (due then too)
    start, end = results[0][0], results[-1][0]
    assert (end - start, tabled) == (120, [start, start + 60, end])
    assert fleet.tick(ints=ints, final=True).table is not None  # the end's table is always logged


def test_the_row_for_gpus_left_out_counts_those_not_ok() -> None:
    fleet = Fleet(80)
    for _ in range(3):
        fleet.tick()
    lose(fleet, fleet.ids[:75], 10)
    names = {n: (f"node-{n}-abcdef", n) for n in fleet.ids}
    rows = fleet.m.gpus.rows(names)
    assert len(rows) == TABLE_CAP + 1 and {r[5] for r in rows[:-1]} == {"lost"}
    assert rows[-1][0] == f"({640 - TABLE_CAP} more GPUs: 40 ok, {600 - TABLE_CAP} lost)"
    assert rows[-1][1:] == [None] * (len(rows[-1]) - 1)
