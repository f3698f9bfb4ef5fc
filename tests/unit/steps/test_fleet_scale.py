"""The slow rank on a fleet whose nodes answer staggered pings (``tests/support/fleet_steps``:
simulated ranks and nodes; the nodes' points, the fleet's ping turn, ``feed_steps`` and the rank
rule real). 192 nodes of 8 ranks: the ping turn reaches each node every 9 s (64 a 3 s tick), so
no two nodes' reads are of the same steps (0.3 s steps: about 30 steps apart). The figures at
1,000 nodes: ``python -m bench.slow_ranks_scale``."""

from __future__ import annotations

from tests.support.fleet_steps import FleetSim, Job

NODES = 192
SLOW_FROM_S = 30.0


def test_a_slow_rank_is_named_on_a_fleet_read_in_turn_with_its_cause() -> None:
    slow = NODES * 8 // 2 + 3
    out = FleetSim(Job(slow_rank=slow, slow_from_s=SLOW_FROM_S), NODES).run(240)
    said = [(a.level, a.title) for _, a in out.alerts]
    assert said == [("WARN", f"Slow rank: rank {slow} on node-{slow // 8}")], said
    assert "waits on its input" in out.alerts[0][1].text
    # The rule holds a rank for its window (120 s) before it speaks; a window every 15 s at most.
    assert SLOW_FROM_S + 120 <= out.alerts[0][0] <= SLOW_FROM_S + 120 + 4 * 15, out.alerts[0][0]


def test_a_balanced_fleet_read_in_turn_is_judged_and_raises_nothing() -> None:
    sim = FleetSim(Job(), NODES)
    out = sim.run(300)
    assert out.alerts == []
    assert out.judged >= 300 // 15 - 3  # judged all along (a window every 15 s), not silent
    rows = sim.health.rows()  # past the table's cap, one row counts the others
    assert {row[-1] for row in rows if isinstance(row[0], int)} == {"ok"}
    assert rows[-1][0] == f"({NODES * 8 - len(rows) + 1} more ranks, none slow)"


def test_a_node_whose_logger_goes_silent_leaves_its_ranks_out_and_the_others_judged() -> None:
    """Node 10's logger answers no ping from 20 s on (gone): after ranks_unread's 180 s its ranks
    are left out, the slow rank on node 96 is still named, and slow communication is not judged
    (the ranks left out could be the ones the others wait for)."""
    slow = NODES * 8 // 2 + 3
    sim = FleetSim(Job(slow_rank=slow, slow_from_s=SLOW_FROM_S), NODES)
    out = sim.run(420, silent=(10, 20.0))
    said = [(a.level, a.title) for _, a in out.alerts]
    assert said == [("WARN", f"Slow rank: rank {slow} on node-{slow // 8}")], said
    assert sim.health.unread == frozenset(range(80, 88))


def test_a_silent_node_on_a_balanced_fleet_raises_nothing() -> None:
    sim = FleetSim(Job(), NODES)
    out = sim.run(420, silent=(10, 20.0))
    assert out.alerts == [] and sim.health.unread == frozenset(range(80, 88))
