"""The flight recorder: the environment that arms it by torch version, and real dumps parsed into
collectives (a waiting rank's all_reduce in flight; the stuck rank's buffer one number earlier)."""

from __future__ import annotations

import json

import pytest

from ray_wandb_nodes._hang.dumps import evidence_from_dumps
from ray_wandb_nodes._hang.flight import Collective, FlightRecord, PgStatus, flight_recorder_env, parse_flight_recorder
from tests.unit.hang_fixtures import capture, filled_ring


@pytest.mark.parametrize(
    ("version", "environ", "expected"),
    [
        ("2.13.0+cpu", {}, {"TORCH_FR_BUFFER_SIZE": "2000"}),
        ("2.8.0", {}, {"TORCH_FR_BUFFER_SIZE": "2000"}),
        ("2.7.1+cu126", {}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
        ("weird", {}, {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}),
        ("2.13.0", {"TORCH_FR_BUFFER_SIZE": "64"}, {}),  # the user's own setting stays
    ],
)
def test_env_by_torch_version(version: str, environ: dict[str, str], expected: dict[str, str]) -> None:
    assert flight_recorder_env(2000, version, environ) == expected


@pytest.mark.parametrize("size", [0, -5, True, 2.5])
def test_bad_buffer_size(size: object) -> None:
    with pytest.raises(ValueError, match=f"buffer_size must be an int > 0 .*got {size!r}"):
        flight_recorder_env(size, "2.13.0")  # type: ignore[arg-type]


def test_a_waiting_rank_lists_the_all_reduce_it_waits_in() -> None:
    r = next(r for r in capture("python") if r["rank"] == 0)
    record = parse_flight_recorder(r["dump_thread"]["flight_recorder"])
    assert record.groups == (PgStatus("0", 5, -1, 4),)
    assert [c.seq for c in record.collectives] == [1, 2, 3, 4, 5]
    assert record.in_flight() == [Collective(5, "all_reduce", "scheduled", "0")]
    assert record.last_seq("0") == 5


def test_the_stuck_rank_ends_one_number_earlier_with_nothing_in_flight() -> None:
    r = next(r for r in capture("python") if r["rank"] == 2)
    record = parse_flight_recorder(r["dump_thread"]["flight_recorder"])
    assert record.in_flight() == [] and record.last_seq("0") == 4
    assert all(c.state == "completed" for c in record.collectives)


def test_stack_traces_are_absent_and_bad_text_is_refused() -> None:
    text = capture("python")[0]["dump_thread"]["flight_recorder"]
    assert all("frames" not in e for e in json.loads(text)["entries"])
    with pytest.raises(ValueError, match="not a flight-recorder dump"):
        parse_flight_recorder("not json")
    with pytest.raises(ValueError, match="not a flight-recorder dump: a JSON list"):
        parse_flight_recorder("[]")
    assert parse_flight_recorder("{}").collectives == ()


def full_ring(rank: int) -> str:
    """Captured rank ``rank``'s recorder with its ring of 2,000 filled (1,995 collectives earlier)."""
    return str(filled_ring(capture("python")[rank]["dump_thread"], 1995)["flight_recorder"])


def test_trimmed_keeps_what_is_in_flight_and_each_groups_newest() -> None:
    record = FlightRecord(
        (
            Collective(7, "all_reduce", "completed", "0"),
            Collective(8, "all_reduce", "completed", "0"),
            Collective(9, "broadcast", "started", "0"),
            Collective(10, "all_reduce", "scheduled", "0"),
            Collective(3, "barrier", "completed", "1"),
            Collective(4, "barrier", "completed", "1"),
        ),
        (PgStatus("0", 10, 9, 8), PgStatus("1", 4, 4, 4)),
    )
    trimmed = record.trimmed()
    assert [c.seq for c in trimmed.collectives] == [9, 10, 4]
    assert trimmed.groups == record.groups
    assert trimmed.in_flight() == record.in_flight()
    assert [trimmed.last_seq(pg) for pg in ("0", "1", "2")] == [10, 4, -1]


@pytest.mark.parametrize(("rank", "flying", "last"), [(0, [2000], 2000), (2, [], 1999)])
def test_a_full_ring_crosses_as_what_the_verdict_reads(rank: int, flying: list[int], last: int) -> None:
    """A rank's evidence holds the collectives in flight and the newest, not the 2,000 of its ring
    (0.6 MB a node of 8 ranks that the driver unpickled and held: 262 MiB at 64 nodes)."""
    full = parse_flight_recorder(full_ring(rank))
    assert len(full.collectives) == 2000 - (rank == 2)
    captured = capture("python")[rank]
    dump = filled_ring(captured["dump_thread"], 1995)
    evidence = evidence_from_dumps(rank, 1, captured["training_ident"], captured["faulthandler"], dump)
    assert evidence.flight is not None
    assert len(evidence.flight.collectives) == 1  # the newest: in flight (#2000) or not (#1999)
    assert [c.seq for c in evidence.flight.in_flight()] == flying == [c.seq for c in full.in_flight()]
    assert evidence.flight.last_seq("0") == last == full.last_seq("0")
