"""The flight recorder: the environment that arms it by torch version, and real dumps parsed into
collectives (a waiting rank's all_reduce in flight; the stuck rank's buffer one number earlier)."""

from __future__ import annotations

import json

import pytest

from ray_wandb_nodes._hang.flight import Collective, PgStatus, flight_recorder_env, parse_flight_recorder
from tests.unit.hang_fixtures import capture


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
