"""The flight recorder: the environment that arms it by torch version, and real dumps parsed into
collectives (a waiting rank's all_reduce in flight; the stuck rank's buffer one number earlier)."""

from __future__ import annotations

import json

import pytest

from ray_wandb_nodes._hang.dumps import evidence_from_dumps
from ray_wandb_nodes._hang.flight import (
    Collective,
    FlightRecord,
    PgStatus,
    flight_recorder_env,
    parse_flight_recorder,
)
from tests.support.hang_fixtures import capture, filled_ring


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
    assert record.groups == (PgStatus("0", 5, -1, 4, "default_pg"),)
    assert [c.seq for c in record.collectives] == [1, 2, 3, 4, 5]
    assert record.in_flight() == [Collective(5, "all_reduce", "scheduled", "0", record=4)]
    assert record.pending() == record.in_flight()
    assert record.last_seq("0") == 5


def test_the_stuck_rank_ends_one_number_earlier_with_nothing_in_flight() -> None:
    r = next(r for r in capture("python") if r["rank"] == 2)
    record = parse_flight_recorder(r["dump_thread"]["flight_recorder"])
    assert record.in_flight() == [] and record.last_seq("0") == 4
    assert all(c.state == "completed" for c in record.collectives)


def test_several_groups_are_known_by_name_and_each_status_by_the_recorders_own_id() -> None:
    """Real dumps of four gloo ranks in ``pair_0_1`` and ``pair_2_3`` besides the default group:
    each pair is ``pg_id`` 1 on its ranks and named ``1`` and ``2``; ``pg_status`` is keyed by
    ``pg_id``, the collectives by name. gloo gives no group's ranks (``pg_config`` holds one
    group named ``""`` with none)."""
    ranks = {r["rank"]: parse_flight_recorder(r["dump_thread"]["flight_recorder"]) for r in capture("groups")}
    assert json.loads(capture("groups")[2]["dump_thread"]["flight_recorder"])["pg_config"] == {
        "": {"desc": "", "name": "", "ranks": "[]"}
    }
    assert [(g.pg, g.desc, g.last_enqueued, g.ranks) for g in ranks[2].groups] == [
        ("0", "default_pg", 9, ()),
        ("2", "pair_2_3", 13, ()),
    ]
    assert [(g.pg, g.desc, g.last_enqueued) for g in ranks[0].groups] == [("0", "default_pg", 10), ("1", "pair_0_1", 5)]
    # Rank 2 waits in its pair's all_reduce #13, ranks 0-1 in the default group's #10.
    assert [(c.pg, c.seq, c.op) for c in ranks[2].pending()] == [("2", 13, "all_reduce")]
    assert [(c.pg, c.seq) for c in ranks[0].pending()] == [("0", 10)]
    assert not ranks[0].knows("2") and ranks[3].knows("2") and ranks[3].last_seq("2") == 12
    # The stopped rank 3: nothing in flight; its pair's #12 retired while gloo's status still
    # says 11 completed: the entry decides.
    assert ranks[3].in_flight() == [] and ranks[3].group("2") == PgStatus("2", 12, -1, 11, "pair_2_3")
    assert ranks[3].last_completed("2") == 12


def nccl_dump(entries: list[tuple[int, str, str, int, str, bool]], status: dict[str, tuple[int, int, int]]) -> str:
    """A dump in the form of torch 2.13's recorder with NCCL (its ``pg_config`` has each group's
    ranks, its entries the states ``scheduled``, ``started``, ``completed``): ``entries`` as
    (pg_id, name, op, seq, state, p2p), oldest first."""
    names = {"0": ("0", "default_pg", "[0, 1, 2, 3]"), "1": ("3", "mesh_tp", "[2, 3]"), "2": ("7", "pipe", "[1, 3]")}
    return json.dumps(
        {
            "version": "2.10",
            "pg_config": {n: {"name": n, "desc": d, "ranks": r} for n, d, r in names.values()},
            "pg_status": {
                k: dict(zip(("last_enqueued_collective", "last_started_collective", "last_completed_collective"),
                            map(str, numbers), strict=True))
                for k, numbers in status.items()
            },
            "entries": [
                {"record_id": i, "pg_id": int(pg_id), "process_group": [name, names[pg_id][1]],
                 "collective_seq_id": seq, "p2p_seq_id": i if p2p else 0, "is_p2p": p2p,
                 "profiling_name": f"nccl:{op}", "state": state, "retired": state == "completed"}
                for i, (pg_id, name, op, seq, state, p2p) in enumerate(entries)
            ],
        }
    )  # fmt: skip


def test_nccl_a_rank_waits_in_each_groups_oldest_collective_not_completed() -> None:
    """With NCCL a rank enqueues collectives without waiting: in flight are #41 and #42 of its TP
    group; it waits in #41, not in the newest. A send's number is the group's last collective's,
    not its own: it is in flight, never pending, and moves no group's last number."""
    record = parse_flight_recorder(
        nccl_dump(
            [
                ("0", "0", "all_reduce", 9, "completed", False),
                ("1", "3", "all_reduce", 40, "completed", False),
                ("1", "3", "all_gather", 41, "started", False),
                ("0", "0", "all_reduce", 10, "scheduled", False),
                ("1", "3", "reduce_scatter", 42, "scheduled", False),
                ("2", "7", "send", 0, "started", True),
            ],
            {"0": (10, 9, 9), "1": (42, 41, 40), "2": (0, 0, 0)},
        )
    )
    assert [(g.pg, g.desc, g.ranks) for g in record.groups] == [
        ("0", "default_pg", (0, 1, 2, 3)),
        ("3", "mesh_tp", (2, 3)),
        ("7", "pipe", (1, 3)),
    ]
    assert [(c.pg, c.seq, c.op) for c in record.pending()] == [("3", 41, "all_gather"), ("0", 10, "all_reduce")]
    assert [c.op for c in record.in_flight()] == ["all_reduce", "all_gather", "reduce_scatter", "send"]
    assert record.knows("7") and record.last_seq("7") == 0 and record.last_completed("3") == 40
    trimmed = record.trimmed()
    assert trimmed.pending() == record.pending() and trimmed.last_seq("3") == 42


def test_a_status_whose_group_left_the_ring_is_dropped() -> None:
    """``pg_status`` names a group by the recorder's id only: with none of its entries left in
    the ring there is no name to give it (a group of ``pg_config``'s is still known by it)."""
    record = parse_flight_recorder(
        nccl_dump([("0", "0", "all_reduce", 10, "scheduled", False)], {"0": (10, 9, 9), "5": (3, 3, 3)})
    )
    assert [g.pg for g in record.groups] == ["0", "3", "7"]
    assert record.group("3") == PgStatus("3", -1, -1, -1, "mesh_tp", (2, 3))


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
    assert trimmed.in_flight() == record.in_flight() and trimmed.pending() == record.pending()
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
