"""When a suspicion is a hang (``_hang/confirm.py``), from tables: the policy re-run on fresh
readings, the back-off between evidence rounds, and the place a verdict names."""

from __future__ import annotations

import pytest

from ray_wandb_nodes._hang import HangRow, HangTimeout, Phase, RankProgress, Verdict
from ray_wandb_nodes._hang.confirm import Rounds, backoff_s, counts_of, describe_place, place_of, still_hung

T = HangTimeout(seconds=30)


def rank(r: int, age: float, steps: int = 5, pid: int = 0, phase: Phase = Phase.RUNNING) -> RankProgress:
    return RankProgress(r, pid or 100 + r, steps, steps, True, age, phase, age, 1.0, 12)


BEFORE = {r: counts_of(rank(r, 0)) for r in range(4)}  # every rank at step 5 at the suspicion


@pytest.mark.parametrize(
    ("fresh", "unanswered", "hung"),
    [
        # every rank read again, still silent past the limit: a hang of all four
        ([rank(r, 31) for r in range(4)], [], [0, 1, 2, 3]),
        # read again, every rank moved (the ping was old): nothing
        ([rank(r, 2, steps=6) for r in range(4)], [], []),
        # moved, then silent past the limit again since: not this suspicion's hang (a new one will be)
        ([rank(r, 31, steps=6) for r in range(4)], [], []),
        # the same counts, progress stamped since (a phase entered or left): not silent past the limit
        ([rank(r, 3) for r in range(4)], [], []),
        # a new process (a restart) at the same counts: not the suspected rank
        ([rank(0, 40, pid=999), *(rank(r, 40) for r in range(1, 4))], [], [1, 2, 3]),
        # only rank 3 still silent, the others moved: rank 3
        ([rank(0, 1, steps=6), rank(1, 1, steps=6), rank(2, 1, steps=6), rank(3, 45)], [], [3]),
        # node of ranks 2-3 gave no answer, ranks 0-1 moved: one silent node makes no hang
        ([rank(0, 1, steps=6), rank(1, 1, steps=6)], [rank(2, 50), rank(3, 50)], []),
        # node of ranks 2-3 gave no answer, ranks 0-1 still silent: the answered ranks are the hang
        ([rank(0, 35), rank(1, 35)], [rank(2, 50), rank(3, 50)], [0, 1]),
        # every node silent: nothing fresh proves a hang
        ([], [rank(r, 50) for r in range(4)], []),
        # an unanswered rank checkpointing within its limit (3 x 30 s) holds the others' silence
        ([rank(0, 35), rank(1, 35)], [rank(2, 50, phase=Phase.CHECKPOINTING), rank(3, 35)], []),
    ],
)
def test_a_suspicion_is_a_hang_only_while_fresh_readings_show_no_progress(
    fresh: list[RankProgress], unanswered: list[RankProgress], hung: list[int]
) -> None:
    assert [p.rank for p in still_hung(T, fresh, unanswered, BEFORE)] == hung


def test_the_back_off_starts_at_the_limit_or_a_minute_and_doubles_to_ten_minutes() -> None:
    assert [backoff_s(HangTimeout(seconds=4), n) for n in (1, 2, 3)] == [4.0, 8.0, 16.0]
    assert [backoff_s(HangTimeout(auto=True), n) for n in (1, 2, 5, 9)] == [60.0, 120.0, 600.0, 600.0]
    assert backoff_s(HangTimeout(seconds=900), 1) == 60.0


def test_rounds_back_off_one_suspicion_and_let_another_come_after_the_first_back_off() -> None:
    rounds = Rounds()
    same, other = frozenset({(3, (103, 5, 5))}), frozenset({(2, (102, 5, 5))})
    assert rounds.due(T, same, 0.0)  # a first round: at once
    rounds.missed(same, 0.0)
    assert not rounds.due(T, same, 29.0) and rounds.due(T, same, 30.0)
    rounds.missed(same, 30.0)  # twice in a row: twice as long
    assert not rounds.due(T, same, 89.0) and rounds.due(T, same, 90.0)
    assert not rounds.due(T, other, 59.0) and rounds.due(T, other, 60.0)  # another: the first back-off
    rounds.confirmed()
    assert rounds.due(T, same, 30.5)


def row(r: int, where: str, reports: int, state: str = "stopped") -> HangRow:
    return HangRow(r, "node-a", "", reports * 10, reports, 40.0, state, where, "", None)


def verdict(rows: list[HangRow], stopped: tuple[int, ...]) -> Verdict:
    return Verdict("a sentence", stopped, (), tuple(rows), ())


SHARD = "load_next_shard (train.py:47)"


def test_a_verdicts_place_is_its_stopped_ranks_function_line_and_reports_since_the_checkpoint() -> None:
    waits = row(0, "hang_loop (train.py:93)", 52, state="waits")
    # Attempt 1 ran from scratch, checkpointed at its 50th report and stopped at its 52nd; attempt
    # 2, restored from that checkpoint (its beacon counts from zero), stops at its 2nd: one place.
    first = place_of(verdict([waits, row(1, SHARD, 52)], (1,)), checkpoint_reports=50)
    assert first == frozenset({(SHARD, 2)})
    assert place_of(verdict([row(0, "hang_loop (train.py:93)", 2, "waits"), row(1, SHARD, 2)], (1,))) == first
    assert describe_place(first) == f"{SHARD}, 2 reports after the checkpoint its attempt ran from"
    # The same place whichever rank reads the shard; another report or line is another place.
    assert place_of(verdict([waits, row(3, SHARD, 52)], (3,)), 50) == first
    assert place_of(verdict([waits, row(1, SHARD, 53)], (1,)), 50) != first
    assert place_of(verdict([waits, row(1, "load_next_shard (train.py:48)", 52)], (1,)), 50) != first
    # A stopped rank with no stack (its node gave no answer) has no place to compare.
    assert place_of(verdict([waits, row(1, "no stack", 52)], (1,)), 50) is None
