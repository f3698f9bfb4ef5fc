"""When silence is a hang: ``hang_timeout_s`` validation and the limits of each setting, from a table."""

from __future__ import annotations

import math

import pytest

from ray_wandb_nodes._hang.beacon import Phase, RankProgress
from ray_wandb_nodes._hang.policy import (
    HangTimeout,
    auto_running_limit_s,
    evidence_margin_s,
    hung_ranks,
    job_cadence_s,
    limit_s,
    parse_hang_timeout,
)

AUTO = HangTimeout(auto=True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, HangTimeout()),
        ("auto", HangTimeout(auto=True)),
        (" AUTO ", HangTimeout(auto=True)),
        (30, HangTimeout(seconds=30.0)),
        (0.5, HangTimeout(seconds=0.5)),
    ],
)
def test_valid_settings(value: object, expected: HangTimeout) -> None:
    assert parse_hang_timeout(value) == expected


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "soon", "120", [120], {}])
def test_bad_settings_name_the_value_and_what_is_allowed(value: object) -> None:
    with pytest.raises(ValueError) as err:
        parse_hang_timeout(value)
    assert repr(value) in str(err.value)
    assert '"auto"' in str(err.value) and "None" in str(err.value) and "> 0" in str(err.value)


def test_off_is_not_enabled_and_has_no_limit() -> None:
    assert not HangTimeout().enabled
    assert limit_s(HangTimeout(), cadence_s=1.0, started=True, phase=Phase.RUNNING) is None


# (setting, slowest interval, started, phase, process-group timeout, limit)
LIMITS: list[tuple[str, HangTimeout, float | None, bool, Phase, float | None, float]] = [
    ("auto, fast job: the 120 s floor", AUTO, 0.2, True, Phase.RUNNING, None, 120.0),
    ("auto, no cadence yet: the floor", AUTO, None, True, Phase.RUNNING, None, 120.0),
    ("auto, slow job: five times the slowest interval", AUTO, 60.0, True, Phase.RUNNING, None, 300.0),
    ("auto, in Ray's report barrier: as running", AUTO, 60.0, True, Phase.IN_REPORT, None, 300.0),
    ("auto, first step: ten minutes at least", AUTO, None, False, Phase.RUNNING, None, 600.0),
    ("auto, checkpointing, fast job: ten minutes", AUTO, 0.2, True, Phase.CHECKPOINTING, None, 600.0),
    ("auto, evaluating, slow job: three times running", AUTO, 60.0, True, Phase.EVALUATING, None, 900.0),
    ("auto, preparing (long_phase): ten minutes", AUTO, 0.2, True, Phase.PREPARING, None, 600.0),
    ("auto under Ray's default pg timeout: 1800 - 180", AUTO, 500.0, True, Phase.RUNNING, 1800.0, 1620.0),
    ("auto, slow phase, capped by the pg timeout", AUTO, 200.0, True, Phase.CHECKPOINTING, 1800.0, 1620.0),
    ("auto, a short pg timeout: 60 s margin", AUTO, 1.0, True, Phase.RUNNING, 300.0, 120.0),
    ("auto, a very short pg timeout: half of it", AUTO, 1.0, True, Phase.RUNNING, 100.0, 50.0),
    ("fixed: as given", HangTimeout(seconds=5.0), 60.0, True, Phase.RUNNING, None, 5.0),
    ("fixed, first step: three times", HangTimeout(seconds=5.0), None, False, Phase.RUNNING, None, 15.0),
    ("fixed, checkpointing: three times", HangTimeout(seconds=5.0), None, True, Phase.CHECKPOINTING, None, 15.0),
    ("fixed, preparing: three times", HangTimeout(seconds=5.0), None, True, Phase.PREPARING, None, 15.0),
    (
        "fixed, in a report before any progress: the first step's",
        HangTimeout(seconds=5.0),
        None,
        False,
        Phase.IN_REPORT,
        None,
        15.0,
    ),
    ("fixed above the pg timeout: capped", HangTimeout(seconds=3000.0), None, True, Phase.RUNNING, 1800.0, 1620.0),
]


@pytest.mark.parametrize(
    ("setting", "cadence", "started", "phase", "pg", "expected"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS]
)
def test_limits(
    setting: HangTimeout, cadence: float | None, started: bool, phase: Phase, pg: float | None, expected: float
) -> None:
    assert limit_s(setting, cadence_s=cadence, started=started, phase=phase, pg_timeout_s=pg) == pytest.approx(expected)


def test_margin() -> None:
    assert evidence_margin_s(1800) == 180
    assert evidence_margin_s(300) == 60
    assert evidence_margin_s(60) == 30


def _rank(
    rank: int, age: float, slowest: float | None, started: bool = True, phase: Phase = Phase.RUNNING
) -> RankProgress:
    return RankProgress(rank, 100 + rank, 3, 30, started, age, phase, age, slowest, 12)


def test_hung_ranks_use_the_job_cadence_of_all_ranks() -> None:
    ranks = [_rank(0, 100.0, 30.0), _rank(1, 160.0, 1.0), _rank(2, 9.0, None, started=False)]
    assert job_cadence_s(ranks) == 30.0
    # Limit 150 s (5 x 30 s) for running ranks: rank 1 only; rank 2 has not started (600 s).
    assert [r.rank for r in hung_ranks(AUTO, ranks)] == [1]
    assert [r.rank for r in hung_ranks(HangTimeout(seconds=5.0), ranks)] == [0, 1]
    assert hung_ranks(HangTimeout(), ranks) == []
    assert job_cadence_s([]) is None


@pytest.mark.parametrize("long", [Phase.CHECKPOINTING, Phase.EVALUATING, Phase.PREPARING])
def test_a_rank_in_a_long_phase_within_its_limit_holds_the_others_silence(long: Phase) -> None:
    from ray_wandb_nodes._hang.policy import job_hung

    fixed = HangTimeout(seconds=10)
    waiting = [_rank(r, 25.0, None) for r in (1, 2, 3)]  # past 10 s: in the barrier, waiting on rank 0
    saving = _rank(0, 25.0, None, phase=long)  # within 3 x 10 s
    assert [r.rank for r in hung_ranks(fixed, [saving, *waiting])] == [1, 2, 3]
    assert job_hung(fixed, [saving, *waiting]) == []
    # Past its own limit too: the job hangs, every silent rank named.
    late = _rank(0, 31.0, None, phase=long)
    assert [r.rank for r in job_hung(fixed, [late, *waiting])] == [0, 1, 2, 3]
    # No long phase: the running ranks past the limit hang as before.
    assert [r.rank for r in job_hung(fixed, [_rank(0, 5.0, None), *waiting])] == [1, 2, 3]


def test_a_rank_whose_train_function_has_not_started_is_not_judged() -> None:
    for setting in (AUTO, HangTimeout(seconds=4)):
        assert limit_s(setting, cadence_s=1.0, started=False, phase=Phase.STARTING) is None
    starting = [_rank(r, 3600.0, None, started=False, phase=Phase.STARTING) for r in range(4)]
    assert hung_ranks(HangTimeout(seconds=4), starting) == []


def test_autos_running_limit_is_also_what_a_beacon_leaves_out_as_a_hang() -> None:
    assert auto_running_limit_s(None) == 120.0
    assert auto_running_limit_s(1.0) == 120.0
    assert auto_running_limit_s(60.0) == 300.0
    for cadence in (None, 1.0, 60.0, 400.0):
        assert limit_s(AUTO, cadence_s=cadence, started=True, phase=Phase.RUNNING) == auto_running_limit_s(cadence)
