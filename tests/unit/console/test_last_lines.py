"""Whose last lines a node sends when its ranks' attempts fail, and in which order: every failed
attempt's dead ranks first (their lines from the run's pool, then from the node's share), then the
ranks whose process ended before the attempt did, then the others by rank; each attempt takes half
of what the node has left, so a later attempt's failure is never starved by an earlier one's.

The ranks are files as Ray writes them, for processes that are gone (pids above the kernel's
``pid_max``: no process has them), read by the real tailer thread; a rank still alive is this
test's own process."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from ray_wandb_nodes._config.values import ConsoleMode
from ray_wandb_nodes._console import ConsoleLine, ConsolePlan, ConsoleTailer, Kind, RankProcess
from tests.support.console_rank import worker_file

GONE = 1 << 22  # above the largest pid_max Linux allows (2**22): never a live process
WAIT_S = 30.0  # the tailer thread's finish, on 2 loaded cores: waited on as an event
LINES = 10  # each rank's lines in each attempt (its ring holds them all)
KEY = "0123456789abcdef0123456789abcdef01234567"


class Collected:
    def __init__(self) -> None:
        self.lines: list[ConsoleLine] = []

    def __call__(self, lines: Sequence[ConsoleLine]) -> None:
        self.lines += lines


def text(attempt: int, rank: int, i: int) -> str:
    return f"attempt {attempt} rank {rank} line {i}"


def write_rank(logs: Path, pid: int, attempt: int, rank: int) -> None:
    lines = "".join(f"{text(attempt, rank, i)}\n" for i in range(LINES))
    worker_file(logs, pid, "err").write_text(lines)
    worker_file(logs, pid, "out").write_text("")


def run_attempts(
    logs: Path, node_tails: int, attempts: list[tuple[tuple[int, int], ...]], alive: int | None = None
) -> list[tuple[int, int]]:
    """Eight ranks on one node, one attempt of them a ``dead`` tuple in ``attempts`` (each ending
    failed, with those dead ranks and lines); rank ``alive`` is this process. The (attempt, rank)
    of every rank's line sent, in the order sent."""
    plan = ConsolePlan(ConsoleMode.FAILURES, 0, 0, LINES, node_tails, 0)
    sink = Collected()
    t = ConsoleTailer(plan, logs, sink, poll_s=0.05).start()
    for attempt, dead in enumerate(attempts, 1):
        ranks = []
        for rank in range(8):
            pid = os.getpid() if rank == alive and attempt == 1 else GONE + 100 * attempt + rank
            write_rank(logs, pid, attempt, rank)
            ranks.append(RankProcess(rank, pid))
        t.watch(ranks)
        t.end_attempt(True, dead)
    assert t.finish(False, timeout=WAIT_S)
    sent = [line for line in sink.lines if line.kind is not Kind.NOTE]
    assert all(line.text.startswith("attempt ") for line in sent)
    return [(int(line.text.split()[1]), line.rank) for line in sent]


def order(sent: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (attempt, rank) of each rank's first line, in the order sent."""
    return list(dict.fromkeys(sent))


def test_each_attempt_s_dead_rank_comes_first_and_a_later_attempt_is_not_starved(tmp_path: Path) -> None:
    # Rank 5 dies in attempt 1, rank 2 in attempt 2; the node's share is enough for some healthy
    # ranks' lines: each attempt takes half of what is left of it.
    sent = run_attempts(tmp_path, node_tails=80, attempts=[((5, LINES),), ((2, LINES),)])
    assert order(sent)[:3] == [(1, 5), (1, 0), (1, 1)]  # the dead rank, then the others by rank
    assert sent.count((1, 5)) == LINES and sent.count((2, 2)) == LINES  # both dead ranks' whole rings
    first_of_2 = sent.index((2, 2))
    assert all(a == 1 for a, _ in sent[:first_of_2]) and sent[first_of_2:].count((2, 2)) == LINES
    # Attempt 1 took 40 of the node's 80 (half), attempt 2 gets 20 of the 40 left: healthy lines too.
    assert sum(1 for a, r in sent if a == 1 and r != 5) == 40
    assert sum(1 for a, r in sent if a == 2 and r != 2) == 20


# (what the case is, the node's share, each attempt's dead ranks and their lines from the run's
# pool, the (attempt, rank): lines sent of every rank that sent any)
CASES: list[tuple[str, int, list[tuple[tuple[int, int], ...]], dict[tuple[int, int], int]]] = [
    (
        "the node's share spent before the attempts: the dead ranks' lines come from the pool",
        0,
        [((5, LINES),), ((2, LINES),)],
        {(1, 5): LINES, (2, 2): LINES},
    ),
    (
        "the pool spent: each attempt's dead rank first in the node's share (half of what is left)",
        40,
        [((5, 0),), ((2, 0),)],
        {(1, 5): LINES, (1, 0): LINES, (2, 2): LINES, (2, 0): LINES},
    ),
    (
        "several dead ranks: in the order named, not by rank",
        0,
        [((6, 4), (3, 4), (1, 0))],
        {(1, 6): 4, (1, 3): 4},
    ),
]


@pytest.mark.parametrize(("node_tails", "attempts", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_whose_last_lines_within_a_small_budget(
    tmp_path: Path,
    node_tails: int,
    attempts: list[tuple[tuple[int, int], ...]],
    expected: dict[tuple[int, int], int],
) -> None:
    sent = run_attempts(tmp_path, node_tails, attempts)
    counts = {key: sent.count(key) for key in dict.fromkeys(sent)}
    assert counts == expected
    for a, dead in enumerate(attempts, 1):  # within each attempt, its named dead ranks lead
        named = [(a, r) for r, _ in dead if (a, r) in counts]
        assert [key for key in order(sent) if key[0] == a][: len(named)] == named


def test_a_rank_whose_process_ended_first_comes_before_one_ray_ended(tmp_path: Path) -> None:
    # Rank 0 is alive (this process) as the attempt ends, the others' processes are gone: no dead
    # rank named, the gone ones are sent first and rank 0 last.
    sent = run_attempts(tmp_path, node_tails=1_000, attempts=[()], alive=0)
    assert order(sent) == [(1, r) for r in (1, 2, 3, 4, 5, 6, 7, 0)]


def test_a_secret_a_rank_prints_leaves_the_node_masked(tmp_path: Path) -> None:
    plan = ConsolePlan(ConsoleMode.FAILURES, 0, 0, LINES, 100, 0)
    sink = Collected()
    t = ConsoleTailer(plan, tmp_path, sink, poll_s=0.05).start()
    worker_file(tmp_path, GONE + 1, "err").write_text(f"WANDB_API_KEY={KEY}\nhttps://b/k?X-Amz-Signature=ab12\n")
    t.watch([RankProcess(3, GONE + 1)])
    t.end_attempt(True, ((3, LINES),))
    assert t.finish(False, timeout=WAIT_S)
    assert [line.text for line in sink.lines] == ["WANDB_API_KEY=***", "https://b/k?X-Amz-Signature=***"]
