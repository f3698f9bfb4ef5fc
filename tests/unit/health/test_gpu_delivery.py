"""Every transaction-log block reaches the GPU rules, whatever the fleet size.

The SM clock and ECC counts come in whole blocks of a writer's transaction log, read on the node
every sampling interval, and reach the driver side only with a ping of the node's logger: at
1,000 nodes a logger is pinged about every 47 s. A block waits on the node until two pings have
carried it (``_health/reader.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.block_delivery import _Run, _Tail, simulate, stats_record
from ray_wandb_nodes._health import SummaryReader
from ray_wandb_nodes._health import reader as reader_module


def block(tail: _Tail, run: _Run, t: float, sm: float) -> None:
    """One block's records in the log (two samples of two GPUs) and a fresh sample."""
    for s in (t - 1.0, t):
        tail.records.append(stats_record(s, {"gpu.0.smClock": sm, "gpu.1.smClock": sm}))
    run._system_metrics = {"cpu": [(t, 40.0)]}


def carried(summary: Any) -> list[float]:
    return [b.t for b in summary.gpu_ints] if summary is not None else []


def test_blocks_wait_on_the_node_until_two_pings_carried_them() -> None:
    tail, run = _Tail(), _Run()
    reader = SummaryReader(tail=lambda path: tail)
    for t in (10.0, 20.0, 30.0):  # three blocks between two pings (a ping every 47 s at scale)
        block(tail, run, t, 1980.0)
        reader.read(run)
    assert carried(reader.take()) == [10.0, 20.0, 30.0]
    block(tail, run, 40.0, 1900.0)
    reader.read(run)
    # a second ping carries them again (a lost reply loses nothing), with the new one
    assert carried(reader.take()) == [10.0, 20.0, 30.0, 40.0]
    assert carried(reader.take()) == [40.0]
    assert carried(reader.take()) == []
    assert reader.dropped == 0


def test_a_node_nobody_pings_keeps_the_newest_blocks_and_counts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "PENDING_BATCHES", 3)
    tail, run = _Tail(), _Run()
    reader = SummaryReader(tail=lambda path: tail)
    for t in range(1, 6):
        block(tail, run, float(t * 10), 1980.0)
        reader.read(run)
    assert carried(reader.take()) == [30.0, 40.0, 50.0] and reader.dropped == 2


def test_blocks_before_the_first_sample_wait_for_it() -> None:
    tail, run = _Tail(), _Run()
    reader = SummaryReader(tail=lambda path: tail)
    for s in (1.0, 2.0):
        tail.records.append(stats_record(s, {"gpu.0.smClock": 1980.0}))
    reader.read(run)  # no kept sample yet: no summary
    assert reader.take() is None
    run._system_metrics = {"cpu": [(3.0, 40.0)]}
    reader.read(run)
    assert carried(reader.take()) == [2.0]


def test_at_1000_nodes_every_block_reaches_the_gpu_rules() -> None:
    # The real fleet, pool, pings and monitor, 1,000 simulated nodes of two GPUs each, every one
    # writing a block every 7 samples of 3 s (21 s: twice between two pings of a node).
    out = simulate(1000, 2, 3.0, gpus=2)
    assert out["blocks_written"] == 5000
    assert out["blocks_lost"] == 0 and out["dropped_on_nodes"] == 0, out
    # what has not arrived was written after its node's newest ping: at most three blocks a node (48 s / 21 s)
    assert out["blocks_written"] - out["blocks_received"] <= 3 * 1000
    assert out["delay_max_s"] <= 48.0  # a ping's round at 1,000 nodes (64 a 3 s tick)
    assert out["ecc_verdict_after_block_s"] is not None  # the ECC error of one GPU is judged
