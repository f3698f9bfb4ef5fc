"""The run's console budget and one rank's pipeline: whose lines go live, what a failed attempt
sends, what a healthy one does not, and the echo of a print on both streams (tables of cases)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._config.values import ConsoleMode
from ray_wandb_nodes._console import (
    PLUGIN_LINES,
    RUN_LINES,
    ConsoleLine,
    ConsolePlan,
    EchoFilter,
    Kind,
    RankBudget,
    RankConsole,
    Stream,
    plan_console,
)
from ray_wandb_nodes._console.budget import attempt_share, dead_allowance

OUT, ERR = Stream.OUT, Stream.ERR

# (what the case is, (mode, world size, nodes), the plan: live rank 0, live other, tail, node
# tails, the run's pool for dead ranks)
PLANS: list[tuple[str, tuple[Any, int, int], ConsolePlan]] = [
    ("off: nothing", ("off", 8, 2), ConsolePlan(ConsoleMode("off"), 0, 0, 0, 0, 0)),
    ("rank0, 8 ranks on 2 nodes", ("rank0", 8, 2), ConsolePlan(ConsoleMode("rank0"), 70_000, 0, 200, 5_000, 10_000)),
    (
        "all, 8 ranks: an equal share each",
        ("all", 8, 2),
        ConsolePlan(ConsoleMode("all"), 8_750, 8_750, 200, 5_000, 10_000),
    ),
    (
        "failures: all for last lines",
        ("failures", 8, 2),
        ConsolePlan(ConsoleMode("failures"), 0, 0, 200, 22_500, 45_000),
    ),
    (
        "rank0, 1,024 ranks, 128 nodes",
        ("rank0", 1024, 128),
        ConsolePlan(ConsoleMode("rank0"), 70_000, 0, 20, 78, 10_000),
    ),
    (
        "rank0, 8,192 ranks: 20 at least a rank, the dead ones' from the pool",
        ("rank0", 8192, 1024),
        ConsolePlan(ConsoleMode("rank0"), 70_000, 0, 20, 9, 10_000),
    ),
    ("one rank, one node", ("all", 1, 1), ConsolePlan(ConsoleMode("all"), 70_000, 70_000, 200, 10_000, 10_000)),
]


@pytest.mark.parametrize(("args", "expected"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS])
def test_plan(args: tuple[Any, int, int], expected: ConsolePlan) -> None:
    assert plan_console(*args) == expected


@pytest.mark.parametrize("mode", ["rank0", "all", "failures"])
@pytest.mark.parametrize(("world", "nodes"), [(1, 1), (8, 2), (64, 8), (8192, 1024)])
def test_live_lines_and_every_last_line_fit_under_w_and_b_s_limit(mode: Any, world: int, nodes: int) -> None:
    plan = plan_console(mode, world, nodes)
    live = sum(plan.live(rank) for rank in range(world))
    assert live + plan.node_tails * nodes + plan.dead_tails <= PLUGIN_LINES < RUN_LINES


def test_an_unknown_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ValueError, match="'rank1' is not one of rank0, all, failures, off"):
        plan_console("rank1", 1, 1)  # type: ignore[arg-type]


def line(text: str, rank: int = 0, stream: Stream = OUT) -> ConsoleLine:
    return ConsoleLine(rank, stream, text)


def test_a_rank_sends_live_until_its_share_is_spent_then_keeps_its_last_lines() -> None:
    budget = RankBudget(live=2, tail=3)
    said = [budget.admit(line(str(i))) for i in range(7)]
    assert [s[0].text if s[0] else None for s in said] == ["0", "1", None, None, None, None, None]
    notes = [s[1] for s in said if s[1]]
    spent = "the run's console share of this rank (2 lines) is spent; its last 3 lines are sent when its attempt ends"
    assert notes == [spent]
    note, last = budget.last_lines(limit=100)
    assert note == "2 earlier lines not kept; its last 3 follow"
    assert [x.text for x in last] == ["4", "5", "6"]
    assert budget.last_lines(limit=100) == (None, [])  # the ring is the attempt's: emptied


def test_a_node_s_last_lines_stop_at_its_limit_newest_first_kept() -> None:
    budget = RankBudget(live=0, tail=5)
    for i in range(5):
        assert budget.admit(line(str(i))) == (None, None)  # no live share: no note about one
    note, last = budget.last_lines(limit=2)
    assert note == "3 earlier lines not kept; its last 2 follow"
    assert [x.text for x in last] == ["3", "4"]


ECHO: list[tuple[str, list[tuple[Stream, str, float]], list[bool]]] = [
    ("a print on both streams is kept once", [(OUT, "hi", 0.0), (ERR, "hi", 0.0)], [True, False]),
    ("in either order", [(ERR, "hi", 0.0), (OUT, "hi", 0.1)], [True, False]),
    ("a line twice on one stream is two lines", [(OUT, "==", 0.0), (OUT, "==", 0.0)], [True, True]),
    (
        "each copy matches one copy",
        [(OUT, "x", 0.0), (OUT, "x", 0.0), (ERR, "x", 0.0), (ERR, "x", 0.0), (ERR, "x", 0.0)],
        [True, True, False, False, True],
    ),
    ("too late to be an echo", [(OUT, "hi", 0.0), (ERR, "hi", 6.0)], [True, True]),
]


@pytest.mark.parametrize(("seen", "kept"), [e[1:] for e in ECHO], ids=[e[0] for e in ECHO])
def test_echo(seen: list[tuple[Stream, str, float]], kept: list[bool]) -> None:
    echo = EchoFilter(window_s=5.0)
    assert [echo.admit(stream, text, now) for stream, text, now in seen] == kept


def test_the_echo_filter_remembers_a_bounded_number_of_lines() -> None:
    echo = EchoFilter(size=100)
    for i in range(10_000):
        echo.admit(OUT, f"line {i}", now=0.0)
    assert len(echo) <= 101
    assert echo.admit(ERR, "line 9999", now=0.0) is False  # the newest are the ones remembered


def console(rank: int, mode: Any = "rank0", world: int = 4) -> RankConsole:
    plan = plan_console(mode, world, 1)
    return RankConsole(rank, RankBudget(plan.live(rank), plan.tail), progress_every_s=30.0)


TRACEBACK = b'Traceback (most recent call last):\n  File "train.py", line 9, in loop\nValueError: bad shard 17\n'


def test_by_default_rank_0_is_live_and_another_rank_s_lines_wait() -> None:
    r0, r1 = console(0), console(1)
    assert [x.text for x in r0.feed(OUT, b"epoch 1\n", now=0.0)] == ["epoch 1"]
    assert r1.feed(OUT, b"epoch 1\n", now=0.0) == []


def test_a_failed_attempt_sends_a_waiting_rank_s_last_lines_its_traceback_with_them() -> None:
    r1 = console(1)
    r1.feed(ERR, b"step 1\n" + TRACEBACK, now=0.0)
    sent = r1.end(failed=True, limit=1_000)
    assert [(x.rank, x.text) for x in sent] == [
        (1, "step 1"),
        (1, "Traceback (most recent call last):"),
        (1, '  File "train.py", line 9, in loop'),
        (1, "ValueError: bad shard 17"),
    ]


def test_a_healthy_attempt_sends_nothing_of_a_waiting_rank() -> None:
    r1 = console(1)
    r1.feed(ERR, b"a warning every rank prints\n", now=0.0)
    assert r1.end(failed=False, limit=1_000) == []


def test_a_live_rank_whose_share_ran_out_sends_its_last_lines_at_every_end() -> None:
    r0 = RankConsole(0, RankBudget(live=2, tail=10))
    sent = r0.feed(OUT, b"a\nb\nc\nd\n", now=0.0)
    assert [(x.text, x.kind) for x in sent] == [
        ("a", Kind.TEXT),
        ("b", Kind.TEXT),
        (
            "the run's console share of this rank (2 lines) is spent; its last 10 lines are sent when its attempt ends",
            Kind.NOTE,
        ),
    ]
    assert [x.text for x in r0.end(failed=False, limit=1_000)] == ["c", "d"]


def test_a_print_that_ray_train_writes_to_both_streams_is_sent_once() -> None:
    r0 = console(0)
    sent = r0.feed(OUT, b"hello from rank 0\n", now=0.0) + r0.feed(ERR, b"hello from rank 0\nonly on stderr\n", now=0.0)
    assert [(x.stream, x.text) for x in sent] == [(OUT, "hello from rank 0"), (ERR, "only on stderr")]


def test_a_progress_state_in_passing_is_live_only_never_among_the_last_lines() -> None:
    r1 = console(1)
    r1.feed(ERR, b"\r 10%|#", now=0.0)
    assert r1.tick(now=31.0) == []  # not live: nothing now
    r1.feed(ERR, b"\r100%|##########\n", now=32.0)
    assert [x.text for x in r1.end(failed=True, limit=1_000)] == ["100%|##########"]


def test_off_keeps_nothing() -> None:
    r = console(0, mode="off")
    r.feed(OUT, b"a\n" + TRACEBACK, now=0.0)
    assert r.end(failed=True, limit=1_000) == []


def test_a_node_whose_share_of_last_lines_is_spent_says_so() -> None:
    budget = RankBudget(live=0, tail=5)
    for i in range(5):
        budget.admit(line(str(i)))
    assert budget.last_lines(limit=0) == (
        "its last 5 lines not sent: this node's share of the run's last lines is spent",
        [],
    )


def test_a_new_plan_keeps_what_a_rank_already_sent() -> None:
    budget = RankBudget(live=10, tail=5)
    for i in range(4):
        budget.admit(line(str(i)))
    budget.replan(live=6)  # the worker group grew: every rank's share is smaller
    assert budget.live_left == 2
    budget.replan(live=3)
    assert budget.live_left == 0 and budget.live_spent


# (what the case is, (dead ranks in order, tail, the pool left), each dead rank's lines)
ALLOWANCES: list[tuple[str, tuple[list[int], int, int], dict[int, int]]] = [
    ("one dead rank: its whole ring", ([5], 200, 10_000), {5: 200}),
    ("the attempt takes half the pool at most", ([1, 2, 3], 200, 400), {1: 66, 2: 66, 3: 66}),
    ("the last few lines all at once", ([1], 200, 15), {1: 15}),
    ("nothing left", ([1, 2], 200, 0), {1: 0, 2: 0}),
    ("no dead rank", ([], 200, 10_000), {}),
    ("a rank named twice counts once", ([4, 4, 1], 200, 10_000), {4: 200, 1: 200}),
    (
        "too many for 20 each: the first named get 20, the next what is left, the others none",
        ([9, 3, 7, 1], 20, 100),
        {9: 20, 3: 20, 7: 10, 1: 0},
    ),
    ("8,000 waiters behind one stuck rank: the first 250 named", (list(range(8_000)), 20, 10_000), None),
]


@pytest.mark.parametrize(("args", "expected"), [a[1:] for a in ALLOWANCES], ids=[a[0] for a in ALLOWANCES])
def test_dead_allowance(args: tuple[list[int], int, int], expected: dict[int, int] | None) -> None:
    got = dead_allowance(*args)
    if expected is None:  # the big case, by its totals
        assert list(got) == args[0] and sum(got.values()) == 5_000
        assert all(got[r] == 20 for r in range(250)) and not any(got[r] for r in range(250, 8_000))
    else:
        assert got == expected
        assert list(got) == list(dict.fromkeys(args[0]))  # in the order named
    assert sum(got.values()) <= max(args[2] // 2, min(args[2], 20))


def test_failed_attempts_one_after_another_each_find_lines_in_the_pool() -> None:
    left, given = 10_000, []
    for _ in range(30):  # 30 failed attempts of one dead rank each
        got = dead_allowance([5], 200, left)[5]
        given.append(got)
        left -= got
    assert given[:25] == [200] * 25  # a ring each, for as many attempts as max_failures often allows
    assert all(g > 0 for g in given) and left >= 0


@pytest.mark.parametrize(("left", "share"), [(10_000, 5_000), (39, 20), (20, 20), (7, 7), (0, 0), (-3, 0)])
def test_attempt_share(left: int, share: int) -> None:
    assert attempt_share(left) == share
