"""The slow-rank rule: held for the window before it speaks, one alert an episode and one on
recovery, ranks with one cause in one alert; nothing on a balanced job; and the ``ranks`` table
and history keys it feeds (pure: attributions built from tables of per-rank parts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ray_wandb_nodes._health.alerts import Alert
from ray_wandb_nodes._health.comm_rule import PACE_FLOOR_S, PACE_WINDOWS
from ray_wandb_nodes._health.kinds import EventKind
from ray_wandb_nodes._health.rank_rule import RankPlace, RankRule, RankState
from ray_wandb_nodes._health.rank_table import (
    INPUT_KEY,
    LATENESS_KEY,
    RANK_COLUMNS,
    SLOW_KEY,
    TABLE_CAP,
    rank_history,
    rank_rows,
)
from ray_wandb_nodes._steps import RankWindow, attribute

WINDOW_S, EVERY_S = 120.0, 30.0
PLACES = {r: RankPlace(f"node-gpu-{'ab'[r // 4]}-7a8b9c", r % 4) for r in range(8)}
BASE = {"input": 5.0, "forward": 10.0, "backward": 20.0, "optimizer": 2.0}


def job(
    extra: dict[int, tuple[str, float]] | None = None, n: int = 8, comm: float = 1.0, step: int = 0
) -> list[RankWindow]:
    """One window of ``n`` ranks (ms a step): rank ``r`` spends ``extra[r] = (part, ms)`` more; each
    rank waits from its arrival until the last rank's, plus ``comm``; the rest fills the step."""
    extra = extra or {}
    parts = {r: {**BASE, **({extra[r][0]: BASE[extra[r][0]] + extra[r][1]} if r in extra else {})} for r in range(n)}
    busy = {r: sum(p.values()) for r, p in parts.items()}
    step_ms = max(busy.values()) + comm + 17.0
    windows = [
        RankWindow(
            r, step, step + 100, 100, step_ms / 1e3, p["input"] / 1e3, p["optimizer"] / 1e3, 14,
            p["forward"] / 1e3, p["backward"] / 1e3, (max(busy.values()) - busy[r] + comm) / 1e3,
        )
        for r, p in parts.items()
    ]  # fmt: skip
    return windows


def feed(rule: RankRule, windows: list[RankWindow], start: float, end: float) -> list[tuple[float, Alert]]:
    """Samples every ``EVERY_S`` from ``start`` to ``end`` (inclusive); the alerts with their time."""
    out = []
    t = start
    while t <= end:
        out += [(t, a) for a in rule.judge(windows, t, PLACES)]
        t += EVERY_S
    return out


def test_a_balanced_job_raises_nothing_however_long_it_runs() -> None:
    rule = RankRule(window_s=WINDOW_S)
    assert feed(rule, job(), 0, 3600) == []
    assert {rule.state(r) for r in range(8)} == {RankState.OK}


def test_a_slow_rank_is_said_once_the_window_has_passed_then_once_more_when_it_recovers() -> None:
    rule = RankRule(window_s=WINDOW_S)
    slow = feed(rule, job({2: ("input", 235.0)}), 0, 600)
    assert [t for t, _ in slow] == [WINDOW_S]  # flagged after the window, and not again
    alert = slow[0][1]
    assert alert.title == "Slow rank: rank 2 on node-gpu-a-7a8b9c"
    assert alert.text == (
        "Rank 2 on node-gpu-a-7a8b9c (GPU 2) waits on its input: 240 ms of a 290 ms step (the other ranks' "
        "median: 5.0 ms). The other ranks wait 235 ms a step for it in their collectives: the job loses 81 % "
        "of every step to it. Over steps 0 to 100."
    )
    assert (alert.level, alert.kind, alert.node, alert.gpus, alert.recovered) == (
        "WARN",
        EventKind.SLOW_RANK,
        "node-gpu-a-7a8b9c",
        (2,),
        False,
    )
    assert rule.state(2) is RankState.SLOW and rule.slow_ranks() == {2}
    back = feed(rule, job(), 630, 1200)
    assert [t for t, _ in back] == [630 + WINDOW_S]
    assert back[0][1].title == "Slow rank recovered: rank 2 on node-gpu-a-7a8b9c"
    assert back[0][1].level == "INFO" and back[0][1].recovered
    assert "keeps pace again" in back[0][1].text
    assert rule.state(2) is RankState.OK


def test_a_rank_slow_for_less_than_the_window_is_never_said() -> None:
    rule = RankRule(window_s=WINDOW_S)
    for start in (0, 300, 600):  # slow for 90 s at a time, balanced in between
        assert feed(rule, job({2: ("input", 235.0)}), start, start + 90) == []
        assert feed(rule, job(), start + 120, start + 270) == []


def test_a_sample_that_could_not_compare_the_ranks_neither_counts_nor_breaks_a_streak() -> None:
    rule = RankRule(window_s=WINDOW_S)
    unknown = job()[:1]  # one rank alone: nothing to compare it with
    alerts = []
    for t in range(0, 150, 30):
        alerts += rule.judge(job({2: ("input", 235.0)}), float(t), PLACES)
        alerts += rule.judge(unknown, t + 15.0, PLACES)
    assert [a.title for a in alerts] == ["Slow rank: rank 2 on node-gpu-a-7a8b9c"]


def test_ranks_of_one_node_slow_on_one_cause_are_one_alert() -> None:
    rule = RankRule(window_s=WINDOW_S)
    alerts = [a for _, a in feed(rule, job({r: ("input", 200.0) for r in (4, 5, 6, 7)}), 0, 300)]
    assert len(alerts) == 1
    assert alerts[0].title == "Slow ranks: ranks 4-7 on node-gpu-b-7a8b9c"
    assert alerts[0].gpus == (0, 1, 2, 3) and alerts[0].node == "node-gpu-b-7a8b9c"
    text = alerts[0].text
    assert text.startswith("Ranks 4-7 on node-gpu-b-7a8b9c wait on their input.")
    assert all(f"- rank {r} on node-gpu-b-7a8b9c (GPU {r % 4}) waits on its input" in text for r in (4, 5, 6, 7))


def test_ranks_on_several_nodes_with_one_cause_are_one_alert_that_counts_them() -> None:
    rule = RankRule(window_s=WINDOW_S)
    alerts = [a for _, a in feed(rule, job({r: ("forward", 150.0) for r in (2, 3, 4)}), 0, 300)]
    assert [a.title for a in alerts] == ["Slow ranks: 3 ranks on 2 nodes"]
    assert alerts[0].node == "node-gpu-a-7a8b9c+1" and alerts[0].gpus == ()


def test_two_causes_at_once_are_two_alerts() -> None:
    rule = RankRule(window_s=WINDOW_S)
    alerts = [a for _, a in feed(rule, job({1: ("input", 200.0), 6: ("forward", 200.0)}), 0, 300)]
    assert sorted(a.title for a in alerts) == [
        "Slow rank: rank 1 on node-gpu-a-7a8b9c",
        "Slow rank: rank 6 on node-gpu-b-7a8b9c",
    ]
    assert any("is slow to compute (forward and backward)" in a.text for a in alerts)


def test_every_rank_waiting_long_with_none_late_is_one_slow_communication_alert_and_its_recovery() -> None:
    rule = RankRule(window_s=WINDOW_S)
    assert feed(rule, job(comm=4.0), 0, 300) == []  # the attempt's pace: 4 ms a step in its collectives
    assert rule.comm.pace_s == pytest.approx(0.004)
    slow = feed(rule, job(comm=60.0), 330, 930)
    assert [(t, a.title, a.level) for t, a in slow] == [(330 + WINDOW_S, "Slow communication", "WARN")]
    assert slow[0][1].kind is EventKind.SLOW_COMMUNICATION
    assert "no rank arrives late" in slow[0][1].text
    assert "60 ms: 15.0 times the attempt's pace (4.0 ms a step over steps 0 to 100)" in slow[0][1].text
    assert "the job loses 49 % of every step to it" in slow[0][1].text  # (60 - 4) ms of a 114 ms step
    assert "or ranks take turns arriving late" in slow[0][1].text  # stalls a rank at a time, at scale
    back = feed(rule, job(comm=4.0), 960, 1300)
    assert [(a.title, a.level) for _, a in back] == [("Slow communication recovered", "INFO")]
    assert "1.0 times the attempt's pace" in back[0][1].text
    assert "the job loses 0 % of every step to it" in back[0][1].text


def test_collectives_that_take_most_of_every_step_from_the_first_windows_are_the_attempt_s_pace() -> None:
    """FSDP2 over gloo on a loaded host, a small model on a large fleet: the share is the job's."""
    rule = RankRule(window_s=WINDOW_S)
    assert attribute(job(comm=60.0), rule.threshold).communication is not None  # past the share of a step
    assert feed(rule, job(comm=60.0), 0, 3600) == []
    assert feed(rule, job(comm=100.0), 3630, 7200) == []  # under twice its pace: no alert either


def test_waits_past_twice_the_pace_that_cost_the_job_less_than_the_threshold_say_nothing() -> None:
    """Ranks that take turns arriving late (a loaded host's scheduling, jitter over many nodes) wait
    for each other with none late on the whole: some milliseconds a step past a small pace (CI's
    host: 9.8 ms to 39 ms a step in a 118 ms step). Slow communication is held to what a slow rank
    is: it costs the job at least ``1 - threshold`` of every step past the pace."""
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job(comm=10.0), 0, 300)  # the pace: 10 ms
    waits = job(comm=30.0)  # 3 times the pace, every rank 36 % of its 84 ms step: the job loses 24 %
    assert attribute(waits, rule.threshold).communication is not None
    assert feed(rule, waits, 330, 3600) == []
    slow = feed(rule, job(comm=60.0), 3630, 4000)  # loses (60 - 10) ms of a 114 ms step: 44 %
    assert [a.title for _, a in slow] == ["Slow communication"]


def test_no_one_window_sets_the_pace_and_none_is_judged_before_it() -> None:
    """The pace is the median of an attempt's first windows: one lucky window (a quiet minute on
    the fabric, one timed iteration on CUDA) does not make the job's usual waits read as slow."""
    rule = RankRule(window_s=WINDOW_S)
    windows = [job(comm=60.0)] * (PACE_WINDOWS - 1) + [job(comm=5.0)]  # one lucky window among them
    for i, w in enumerate(windows):
        assert rule.judge(w, i * EVERY_S, PLACES) == []
    assert rule.comm.pace_s == pytest.approx(0.060)
    assert feed(rule, job(comm=60.0), PACE_WINDOWS * EVERY_S, 3600) == []


def test_the_recovery_waits_for_the_waits_to_fall_well_under_twice_the_pace() -> None:
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job(comm=20.0), 0, 300)  # the pace: 20 ms
    assert [a.title for _, a in feed(rule, job(comm=60.0), 330, 700)] == ["Slow communication"]
    assert feed(rule, job(comm=35.0), 730, 1500) == []  # 1.75 times: still slow, no flapping
    back = feed(rule, job(comm=25.0), 1530, 1900)  # 1.25 times: recovered
    assert [a.title for _, a in back] == ["Slow communication recovered"]


def test_the_recovery_comes_once_the_waits_cost_under_half_the_bar_however_many_times_the_pace() -> None:
    """After an episode, everyday waits near twice a small pace cost the job little: they do not
    hold the episode open for good (a later, worse slowdown could not be said)."""
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job(comm=10.0), 0, 300)  # the pace: 10 ms
    assert [a.title for _, a in feed(rule, job(comm=60.0), 330, 700)] == ["Slow communication"]
    back = feed(rule, job(comm=20.0), 730, 1100)  # twice the pace, but 10 ms of a 74 ms step: 14 %
    assert [a.title for _, a in back] == ["Slow communication recovered"]
    assert "2.0 times the attempt's pace (10 ms), of a 74 ms step: the job loses 14 %" in back[0][1].text
    assert [a.title for _, a in feed(rule, job(comm=60.0), 1130, 1500)] == ["Slow communication"]  # said again


def test_a_change_of_the_passes_a_step_sets_the_pace_again() -> None:
    """A micro-batch ramp (Megatron's batch-size ramp-up): every pass's collectives come again, so
    four passes a step wait four times what one did, and the fabric is no slower for it."""
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, [replace(w, passes=1.0) for w in job(comm=10.0)], 0, 300)
    assert rule.comm.pace_s == pytest.approx(0.010)
    ramped = [replace(w, passes=4.0) for w in job(comm=40.0)]  # 4 times the pace: 32 % of a 94 ms step
    assert feed(rule, ramped, 330, 3600) == []
    assert rule.comm.pace_s == pytest.approx(0.040)
    slow = feed(rule, [replace(w, passes=4.0) for w in job(comm=100.0)], 3630, 4000)
    assert [a.title for _, a in slow] == ["Slow communication"]  # judged against the new pace


def test_a_late_rank_s_windows_neither_recover_nor_judge_communication() -> None:
    """While a rank is late the others wait for it: those windows say nothing of the fabric."""
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job(comm=4.0), 0, 300)
    feed(rule, job(comm=60.0), 330, 700)
    late = feed(rule, job({1: ("input", 235.0)}, comm=60.0), 730, 1500)
    assert [a.title for _, a in late] == ["Slow rank: rank 1 on node-gpu-a-7a8b9c"]  # no recovery said


def test_another_attempt_sets_its_own_pace() -> None:
    """A job restarted on fewer nodes (its collectives faster) and then on as many as before is
    not told its communication became slow: each attempt is judged against its own pace."""
    rule = RankRule(window_s=WINDOW_S)
    assert feed(rule, job(comm=60.0), 0, 600) == []
    rule.restart()
    assert feed(rule, job(comm=20.0), 630, 1200) == []  # a smaller attempt: 20 ms
    rule.restart()
    assert feed(rule, job(comm=60.0), 1230, 3600) == []  # as many nodes again: its own pace, 60 ms
    assert rule.comm.pace_s == pytest.approx(0.060)


def test_a_pace_of_no_wait_is_floored() -> None:
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job(comm=0.0), 0, 300)
    assert rule.comm.pace_s == PACE_FLOOR_S
    assert [a.title for _, a in feed(rule, job(comm=60.0), 330, 700)] == ["Slow communication"]


def test_the_threshold_is_the_share_of_each_step_the_job_may_lose() -> None:
    strict = RankRule(threshold=0.9, window_s=WINDOW_S)  # flags a rank costing 10 % of a step
    lenient = RankRule(window_s=WINDOW_S)  # the default 0.7: 30 %
    a = job({2: ("input", 12.0)})  # 12 ms late of a 68 ms step: 18 %
    assert [t for t, _ in feed(strict, a, 0, 300)] == [WINDOW_S]
    assert feed(lenient, a, 0, 300) == []


# the ranks table and history ------------------------------------------------------------------------
def test_a_rank_s_row_holds_its_step_taken_apart_and_its_state() -> None:
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job({2: ("input", 235.0)}), 0, 150)
    rows = rank_rows(range(9), rule.latest, PLACES, rule.state)
    assert len(rows[0]) == len(RANK_COLUMNS)
    row = dict(zip(RANK_COLUMNS, rows[2], strict=True))
    assert row == {
        "rank": 2, "node": "node-gpu-a-7a8b9c", "gpu": 2, "steps": 100, "step_ms": 290.0, "input_ms": 240.0,
        "compute_ms": 30.0, "comm_wait_ms": 1.0, "optimizer_ms": 2.0, "other_ms": 17.0, "lateness_ms": 235.0,
        "state": "slow",
    }  # fmt: skip
    assert dict(zip(RANK_COLUMNS, rows[0], strict=True))["state"] == "ok"
    assert rows[8][:4] == [8, None, None, None] and rows[8][-1] == "unmeasured"  # never read


def test_past_the_cap_the_table_keeps_the_slow_ranks_and_counts_the_others() -> None:
    rule = RankRule(window_s=WINDOW_S)
    feed(rule, job({2: ("input", 235.0)}), 0, 150)
    rows = rank_rows(range(TABLE_CAP + 100), rule.latest, PLACES, rule.state)
    assert len(rows) == TABLE_CAP
    assert any(r[0] == 2 and r[-1] == "slow" for r in rows)
    assert rows[-1][0] == "(101 more ranks, none slow)"


def test_the_history_keys_hold_the_slowest_lateness_and_the_largest_input_wait() -> None:
    slow = attribute(job({2: ("input", 235.0)}))
    assert rank_history(slow, slow=1) == {SLOW_KEY: 1.0, LATENESS_KEY: 235.0, INPUT_KEY: 240.0}
    assert rank_history(None, slow=0) == {SLOW_KEY: 0.0}
    balanced = rank_history(attribute(job()), slow=0)
    assert balanced[LATENESS_KEY] == pytest.approx(0.0)
