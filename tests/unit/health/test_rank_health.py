"""A run's ranks judged on the driver side, from their step totals as their nodes read them (a
simulated synchronous job, each rank on its own clock: ``tests/support/step_sim``): the rank
rule's alerts through the monitor, the ``ranks`` table with the nodes table, the history keys,
and which nodes and GPUs the rule speaks for."""

from __future__ import annotations

from ray_wandb_nodes._health import HealthMonitor, HealthOptions, RankAt
from ray_wandb_nodes._health.ranks import RankHealth
from tests.support.step_sim import Profile, World

WORLD = 4
OFFSETS = [0, 10**12, 5 * 10**9, 7]  # each rank's clock: the verdict never meets two of them
AT = {r: RankAt(f"n{r}", f"node-{r}") for r in range(WORLD)}
WINDOW_S, POLL_S = 10.0, 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor(history_every_s: float = 15.0, **options: object) -> tuple[HealthMonitor, Clock]:
    clock = Clock()
    m = HealthMonitor(HealthOptions(window_s=WINDOW_S, history_every_s=history_every_s, **options), clock=clock)  # type: ignore[arg-type]
    m.set_nodes({f"n{r}": (f"node-{r}", f"h{r}") for r in range(WORLD)}, {f"n{r}": (r,) for r in range(WORLD)})
    return m, clock


def polls(m: HealthMonitor, clock: Clock, world: World, n: int, steps: int = 15) -> list[tuple[str, str, str]]:
    """``n`` polls of the fleet, ``steps`` steps apart: the alerts said, as (level, title, text)."""
    out = []
    for _ in range(n):
        world.run(steps)
        clock.now += POLL_S
        m.rank_steps(world.reads(), AT)
        out += [(a.level, a.title, a.text) for a in m.tick().alerts]
    return out


def test_a_balanced_job_names_no_rank_and_its_table_says_every_rank_ok() -> None:
    m, clock = monitor()
    world = World([Profile()] * WORLD, OFFSETS)
    assert polls(m, clock, world, 12) == []
    rows = {row[0]: row for row in m.ranks.rows()}
    assert sorted(rows) == list(range(WORLD)) and {row[-1] for row in rows.values()} == {"ok"}
    assert {row[1] for row in rows.values()} == {f"node-{r}" for r in range(WORLD)}


def test_a_rank_slow_on_its_input_is_named_once_with_its_node_and_cause_then_once_on_recovery() -> None:
    m, clock = monitor()
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()], OFFSETS)
    said = polls(m, clock, world, 6)
    assert [(level, title) for level, title, _ in said] == [("WARN", "Slow rank: rank 2 on node-2")]
    assert said[0][2].startswith("Rank 2 on node-2 waits on its input: 100 ms of a 136 ms step")
    world.profiles[2] = Profile()
    said = polls(m, clock, world, 6)
    assert [(level, title) for level, title, _ in said] == [("INFO", "Slow rank recovered: rank 2 on node-2")]
    assert "keeps pace again: it arrives no later than the median rank (it waited on its input)" in said[0][2]


def test_no_rank_is_judged_while_one_of_the_placement_is_not_read() -> None:
    rh = RankHealth(window_s=0.0)
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()], OFFSETS)
    for t in range(6):
        world.run(15)
        reads = world.reads()
        del reads[2]  # its node's logger has not answered: rank 2 may be the one the others wait for
        rh.read(reads, AT, float(t))
    assert rh.judged == 0 and rh.take_alerts() == [] and not rh.measured


def test_a_rank_not_read_for_long_is_left_out_and_the_others_judged_without_slow_communication() -> None:
    """Rank 2's node answers nothing from the start (its logger gone); the others' points keep
    coming. Until UNREAD_S no window (it may be the one waited for); past it, the others are judged
    (rank 1 slow on its input is named) and communication is not (the rank left out could be late)."""
    from ray_wandb_nodes._health.ranks import UNREAD_S

    rh = RankHealth(window_s=0.0)
    world = World([Profile(), Profile(input=100.0), Profile(), Profile()], OFFSETS)
    said = []
    for t in range(0, int(UNREAD_S) + 100, 20):
        world.run(15)
        reads = world.reads()
        del reads[2]
        rh.read(reads, AT, float(t))
        said += [(a.title, float(t)) for a in rh.take_alerts()]
    assert [title for title, _ in said] == ["Slow rank: rank 1 on node-1"] and said[0][1] > UNREAD_S
    assert rh.unread == {2}


def test_another_attempt_on_the_same_placement_starts_its_ranks_series_again() -> None:
    rh = RankHealth(window_s=0.0)
    world = World([Profile()] * 4, OFFSETS)
    for t in range(3):
        world.run(15)
        rh.read(world.reads(), AT, float(t), attempt="run.attempt-1")
    judged = rh.judged
    again = World([Profile()] * 4, OFFSETS)  # the next attempt's processes: their counts from 0
    for t in range(3, 6):
        again.run(15)
        rh.read(again.reads(), AT, float(t), attempt="run.attempt-2")
    assert judged >= 1 and rh.judged >= judged + 1  # judged anew at once, not after 45 steps more


def test_a_new_placement_starts_the_windows_again_and_forgets_the_ranks_gone() -> None:
    rh = RankHealth(window_s=0.0)
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()], OFFSETS)
    for t in range(4):
        world.run(15)
        rh.read(world.reads(), AT, float(t))
    assert rh.rule.slow_ranks() == {2}
    three = {r: AT[r] for r in (0, 1, 3)}  # a restart on three ranks (say): rank 2's episode ends unsaid
    world.run(15)
    rh.read({r: t for r, t in world.reads().items() if r != 2}, three, 5.0)
    assert rh.rule.slow_ranks() == frozenset() and 2 not in rh.places and [r[0] for r in rh.rows()] == [0, 1, 3]


def test_the_ranks_table_comes_with_the_nodes_table_and_the_first_alert_brings_one_at_once() -> None:
    m, clock = monitor()
    world = World([Profile(), Profile(input=100.0), Profile(), Profile()], OFFSETS)
    world.run(15)
    clock.now += POLL_S
    m.rank_steps(world.reads(), AT)
    assert m.tick().rank_table is None  # no table before one is due
    tables = []
    for _ in range(5):
        world.run(15)
        clock.now += POLL_S
        m.rank_steps(world.reads(), AT)
        result = m.tick()
        if result.rank_table is not None:
            tables.append((result.alerts, result.rank_table))
    alerts, table = tables[0]  # the alert's tick: the table at once, rank 1 slow in it
    assert [a.title for a in alerts] == ["Slow rank: rank 1 on node-1"]
    assert [row[-1] for row in table] == ["ok", "slow", "ok", "ok"]
    assert m.tick(final=True).rank_table is not None  # and at the end


def test_the_history_keys_come_at_most_every_interval_and_at_once_when_the_slow_count_changes() -> None:
    m, clock = monitor(history_every_s=12.0)
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()], OFFSETS)
    got = []
    for _ in range(8):
        world.run(15)
        clock.now += POLL_S
        m.rank_steps(world.reads(), AT)
        history = m.tick().rank_history
        if history is not None:
            got.append((clock.now - 1000.0, history))
    # The first judgement (the first poll only sets each rank's base); the flag, 10 s later (a count
    # changed: at once); then 15 s later (the poll 10 s after it is within the 12 s).
    assert [t for t, _ in got] == [10.0, 20.0, 35.0]
    assert got[0][1] == {"ranks/slow": 0.0, "ranks/lateness_ms": 95.0, "ranks/input_wait_ms": 100.0}
    assert got[1][1]["ranks/slow"] == 1.0
    clock.now += POLL_S
    assert m.tick().rank_history is None  # no judgement since: nothing


def test_the_rule_speaks_for_a_slow_ranks_node_and_gpu_and_for_no_other() -> None:
    rh = RankHealth(window_s=0.0)
    world = World([Profile(), Profile(), Profile(input=100.0), Profile()], OFFSETS)
    gpu = {"n2": {2: 1}}  # rank 2 holds GPU 1 of its node
    for t in range(2):  # named by its first judgement: an episode under way
        world.run(15)
        rh.read(world.reads(), AT, float(t), gpu_of=lambda node, rank: gpu.get(node, {}).get(rank))
    assert rh.rule.slow_ranks() == frozenset() and rh.claims("n2")
    assert rh.claims("n2", (1,)) and not rh.claims("n2", (0,)) and not rh.claims("n1")
    assert rh.places[2].gpu == 1 and rh.places[1].gpu is None
