"""Collective waits from the flight recorder, where DDP's timers are not there: what a gloo dump
gives (nothing: checked on a real one) and what NCCL's timed entries give (the rank that joins
last has the shortest collectives), matched by process group and sequence number."""

from __future__ import annotations

import json

import pytest

from ray_wandb_nodes._steps import collective_waits, timed_collectives

# Two entries of a real dump (torch 2.13, gloo, two ranks, rank 1 late to every all_reduce):
# no duration, and the times "discovered" stay 0.
GLOO_ENTRY = {
    "collective_seq_id": 2, "input_dtypes": ["Float"], "input_sizes": [[4]], "is_p2p": False, "op_id": 2,
    "output_dtypes": ["Float"], "output_sizes": [[4]], "p2p_seq_id": 0, "pg_id": 0,
    "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce", "record_id": 1, "retired": True,
    "state": "scheduled", "thread_id": "139874138938240", "thread_name": "python",
    "time_created_ns": 1796426815362990087, "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0,
    "timeout_ms": 1800000,
}  # fmt: skip
GLOO_DUMP = json.dumps(
    {
        "version": "2.10",
        "entries": [GLOO_ENTRY, {**GLOO_ENTRY, "collective_seq_id": 3, "record_id": 2, "retired": False}],
        "pg_status": {"0": {"last_completed_collective": "2", "last_enqueued_collective": "3"}},
    }
)


def nccl_dump(durations_ms: dict[int, float], pg: str = "0") -> str:
    entries = [
        {
            "collective_seq_id": seq, "process_group": [pg, "default_pg"], "profiling_name": "nccl:all_reduce",
            "state": "completed", "duration_ms": ms, "time_created_ns": 10**18 + seq,
        }
        for seq, ms in durations_ms.items()
    ]  # fmt: skip
    return json.dumps({"version": "2.10", "entries": entries})


def test_a_gloo_dump_holds_no_duration_so_it_names_no_rank() -> None:
    assert timed_collectives(GLOO_DUMP) == []
    assert collective_waits({0: timed_collectives(GLOO_DUMP), 1: timed_collectives(GLOO_DUMP)}) == []


def test_the_rank_that_joins_last_has_the_least_time_in_the_collectives_every_rank_timed() -> None:
    per_rank = {
        0: timed_collectives(nccl_dump({5: 90.0, 6: 95.0, 7: 92.0})),
        1: timed_collectives(nccl_dump({5: 3.0, 6: 2.5, 7: 2.8, 8: 3.0})),  # late; #8 only it has
        2: timed_collectives(nccl_dump({4: 1.0, 5: 88.0, 6: 91.0, 7: 90.0})),  # #4 only it has
    }
    waits = collective_waits(per_rank)
    assert [(w.rank, w.collectives) for w in waits] == [(0, 3), (1, 3), (2, 3)]
    assert min(waits, key=lambda w: w.total_s).rank == 1
    assert waits[1].total_s == pytest.approx(0.0083)


def test_collectives_are_matched_per_process_group() -> None:
    per_rank = {0: timed_collectives(nccl_dump({1: 5.0}, pg="0")), 1: timed_collectives(nccl_dump({1: 5.0}, pg="1"))}
    assert collective_waits(per_rank) == []


def test_text_that_is_not_a_dump_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a flight-recorder dump"):
        timed_collectives("[1, 2]")
