"""The fleet's hang watch over a fake pool (no Ray): one alert a hang with every rank's evidence
asked at once, one INFO when progress resumes, a new hang after that, and what the notice holds."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from ray_wandb_nodes._fleet.hangs import HangWatch, aged, poll_s
from ray_wandb_nodes._hang import HangNotice, HangTimeout, Phase, RankEvidence, RankProcess, RankProgress, hang_notice
from ray_wandb_nodes._hang.stacks import Frame, ThreadStack
from ray_wandb_nodes._hang.verdict import judge
from ray_wandb_nodes._warn import Warner

USER = "/home/me/train.py"
ATTEMPT = "run-1.a1.0badcafe"  # the ranks' attempt: their folder on each node, the key of a ping's progress
SHARD = (Frame(USER, 71, "load_next_shard"), Frame(USER, 90, "train_loop"))


def progress(rank: int, age: float, steps: int = 5, reports: int = 5) -> RankProgress:
    return RankProgress(rank, 100 + rank, reports, steps, True, age, Phase.RUNNING, age, 1.0, 12)


@dataclass
class Node:
    label: str


@dataclass
class Handle:
    node: Node
    progress: dict[str, tuple[RankProgress, ...]]
    progress_at: float = 0.0
    actor: Any = None


@dataclass
class Pool:
    handles: dict[str, Handle]
    clock: float = 0.0

    def get(self, node_id: str) -> Handle | None:
        return self.handles.get(node_id)


@dataclass
class Spec:
    label: str = "node-head"


@dataclass
class Primary:
    spec: Spec = field(default_factory=Spec)


@dataclass
class Health:
    ages: dict[str, float] = field(default_factory=dict)

    def progress(self, ages: dict[str, float]) -> None:
        self.ages = ages


@dataclass
class Target:
    ranks: dict[str, tuple[int, ...]]
    health: Health = field(default_factory=Health)
    rank_gpus: dict[int, tuple[str, ...]] = field(default_factory=dict)
    covered_node: str | None = None
    run_id: str = "run-1"
    primary: Primary = field(default_factory=Primary)
    attempt: str | None = ATTEMPT


def setup(ages: dict[int, float], steps: int = 5) -> tuple[Target, Pool]:
    target = Target(ranks={"a": (0, 1), "b": (2, 3)}, rank_gpus={r: (str(r % 2),) for r in range(4)})
    pool = Pool(
        {
            n: Handle(Node(f"node-{n}"), {ATTEMPT: tuple(progress(r, ages[r], steps) for r in ranks)})
            for n, ranks in target.ranks.items()
        }
    )
    return target, pool


def evidence_of(rank: int) -> RankEvidence:
    return RankEvidence(rank, 100 + rank, 7, native=(ThreadStack(7, SHARD, "TrainingThread(train_loop)"),))


def test_one_alert_a_hang_with_every_ranks_evidence_then_one_when_progress_resumes() -> None:
    target, pool = setup({0: 2, 1: 2, 2: 2, 3: 2})
    watch = HangWatch(HangTimeout(seconds=10), clock=lambda: pool.clock)
    asked: list[list[Any]] = []
    asked_ranks: list[list[list[int]]] = []
    notices: list[HangNotice] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        asked.append(actors)
        asked_ranks.append(ranks)
        return [tuple((progress(r, 12), evidence_of(r)) for r in target.ranks[n]) for n in ("a", "b")]

    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert notices == [] and asked == []  # within the limit: nothing asked
    assert target.health.ages == {"a": 2.0, "b": 2.0}  # the nodes table's last progress
    pool.clock = 11.0  # the pings' ages are 11 s old: past the limit now
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert len(asked) == 1 and len(asked[0]) == 2  # both nodes, once, at once
    assert asked_ranks == [[sorted(target.ranks[n]) for n in ("a", "b")]]  # each only for the ranks placed there
    (hang,) = notices
    assert hang.level == "ERROR" and hang.title == "Hang: ranks 0-3 stopped"
    assert hang.text.startswith("every rank (0-3) is in load_next_shard (train.py:71)")
    assert "rank 2 on node-b GPU 0" in hang.text
    assert [name for name, _ in hang.files] == ["verdict.txt", "rank-0.txt", "rank-1.txt", "rank-2.txt", "rank-3.txt"]
    assert [row.rank for row in hang.rows] == [0, 1, 2, 3]
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert len(notices) == 1 and len(asked) == 1  # one alert an episode
    # Rank 2 steps again: the episode ends with an INFO.
    pool.handles["b"].progress = {ATTEMPT: (progress(2, 0.1, steps=6), progress(3, 14))}
    pool.handles["b"].progress_at = pool.clock
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR", "INFO"] and notices[1].title == "Hang over: rank 2 progress again"
    assert not notices[1].rows and not notices[1].files


def test_a_hang_needs_its_limit_and_ages_grow_with_the_pings_age() -> None:
    ranks = (progress(0, 3.0),)
    assert aged(ranks, 0.0) == ranks
    assert aged(ranks, 4.5)[0].age_s == 7.5 and aged(ranks, 4.5)[0].phase_age_s == 7.5
    assert poll_s(HangTimeout(seconds=4), 3.0) == 0.25 and poll_s(HangTimeout(seconds=32), 3.0) == 2.0
    assert poll_s(HangTimeout(auto=True), 3.0) == 3.0 and poll_s(HangTimeout(seconds=600), 3.0) == 3.0


def test_the_notice_names_the_stopped_ranks_their_node_gpu_and_when() -> None:
    from ray_wandb_nodes._hang import RankFacts

    facts = [RankFacts(progress(r, 65.0, steps=8), evidence_of(r), f"node-{r}", (str(r),)) for r in range(2)]
    now = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.timezone.utc)
    notice = hang_notice(judge(facts), facts, 3, "restart", now=now)
    assert notice.folder == "hangs/hang-3" and notice.stopped == (0, 1)
    assert "rank 1 on node-1 GPU 1: last progress at step 8, report 5, since 11:58:55 UTC" in notice.text
    assert "on_hang='restart'" in notice.text
    rank_file = dict(notice.files)["rank-1.txt"]
    assert "rank 1 (pid 101) on node-1, GPU 1" in rank_file and "load_next_shard" in rank_file
    assert notice.table()[0][:7] == [0, "node-0", "0", 8, 5, 65.0, "stuck"]


def test_a_restarted_attempt_ends_the_episode_without_an_alert_and_can_hang_again() -> None:
    watch = HangWatch(HangTimeout(seconds=10), on_hang="alert")
    target, pool = setup({0: 20, 1: 20, 2: 20, 3: 20})
    notices: list[HangNotice] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        return [tuple((progress(r, 20), evidence_of(r)) for r in target.ranks[n]) for n in ("a", "b")]

    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR"]
    # New processes (Ray restarted the worker group): no "progress again", the episode closes.
    for handle in pool.handles.values():
        handle.progress = {
            ATTEMPT: tuple(
                RankProgress(p.rank, p.pid + 1000, 0, 0, False, 1.0, Phase.RUNNING, 1.0, None, 12)
                for p in handle.progress[ATTEMPT]
            )
        }
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR"] and not watch.open
    for handle in pool.handles.values():
        handle.progress = {ATTEMPT: tuple(progress(p.rank, 40.0) for p in handle.progress[ATTEMPT])}
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR", "ERROR"] and notices[1].episode == 2


def test_after_restart_ends_an_attempt_a_waiter_let_go_is_no_progress() -> None:
    watch = HangWatch(HangTimeout(seconds=10), on_hang="restart")
    watch.end_attempt = lambda *args: None  # type: ignore[method-assign]  # no Ray here
    target, pool = setup({0: 20, 1: 20, 2: 20, 3: 20})
    notices: list[HangNotice] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        return [tuple((progress(r, 20), evidence_of(r)) for r in target.ranks[n]) for n in ("a", "b")]

    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    # Rank 0's report returns as Ray resets its barrier for the failed attempt: same process.
    pool.handles["a"].progress = {ATTEMPT: (progress(0, 0.1, steps=5, reports=6), progress(1, 21))}
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR"] and watch.open
    # The restarted attempt: new processes end the episode, silently.
    pool.handles["a"].progress = {ATTEMPT: (RankProgress(0, 900, 0, 0, False, 1.0, Phase.RUNNING, 1.0, None, 12),)}
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR"] and not watch.open


def test_ranks_whose_train_function_returned_are_not_judged() -> None:
    """Train's poll says the train function returned (the worker group not yet shut down): the
    ranks' silence is the end of training, not a hang (seen once at a fit's end: "every rank
    (0-3): no stack came back")."""
    target, pool = setup({0: 20, 1: 20, 2: 20, 3: 20})
    watch = HangWatch(HangTimeout(seconds=10), clock=lambda: pool.clock)
    notices: list[HangNotice] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        return [tuple((progress(r, 20), evidence_of(r)) for r in target.ranks[n]) for n in ("a", "b")]

    watch.finished = frozenset({0, 1, 2, 3})
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert notices == []
    watch.finished = frozenset({0, 1})  # two still training and silent: those two are judged
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.title for n in notices] == ["Hang: ranks 2-3 stopped"]


def test_only_the_current_attempts_readings_are_judged() -> None:
    """A ping that still carries the last attempt's ranks (read before the restart) is not this
    attempt's progress: the watch reads the ranks of ``target.attempt`` only, and none before
    its ranks are armed."""
    target, pool = setup({0: 50, 1: 50, 2: 50, 3: 50})
    for handle in pool.handles.values():
        handle.progress = {"run-1.a0.0badcafe": handle.progress[ATTEMPT]}  # the last attempt's, long silent
    notices: list[HangNotice] = []
    HangWatch(HangTimeout(seconds=10)).check(target, pool, Warner(), notices.append, lambda *a: [])  # type: ignore[arg-type]
    assert notices == [] and target.health.ages == {}
    target, pool = setup({0: 50, 1: 50, 2: 50, 3: 50})
    target.attempt = None
    HangWatch(HangTimeout(seconds=10)).check(target, pool, Warner(), notices.append, lambda *a: [])  # type: ignore[arg-type]
    assert notices == []


def test_an_end_names_the_attempt_and_each_stopped_ranks_process_as_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The end a node gets carries the attempt's key and each stopped rank's pid and start time as
    the evidence round read them: a node ends those processes or refuses (``_hang/node.py``)."""
    sent: list[tuple[str, Any, list[RankProcess], str]] = []

    class Actor:
        def __init__(self, node: str) -> None:
            self.end_ranks = SimpleNamespace(
                remote=lambda key, processes, why: sent.append((node, key, processes, why))
            )

    target, pool = setup({0: 20, 1: 20, 2: 20, 3: 20})
    for node, handle in pool.handles.items():
        handle.actor = Actor(node)
    awaited: list[Any] = []
    monkeypatch.setattr("ray_wandb_nodes._fleet.hangs._await_ends", lambda pending, warner: awaited.append(pending))
    started = {0: 7001, 1: 7002, 2: 7003, 3: 7004}

    def ask(actors: list[Any], key: str, ranks: list[list[int]]) -> list[Any]:
        assert key == ATTEMPT
        fresh = [
            tuple((replace(progress(r, 20), proc_start=started[r]), evidence_of(r)) for r in mine) for mine in ranks
        ]
        fresh[1] = (fresh[1][0], (replace(progress(3, 0.5, steps=9), proc_start=started[3]), evidence_of(3)))
        return fresh

    notices: list[HangNotice] = []
    HangWatch(HangTimeout(seconds=10), on_hang="restart").check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    [notice] = notices
    assert notice.stopped and len(awaited) == 1
    assert {(node, key) for node, key, _, _ in sent} == {(n, ATTEMPT) for n in ("a", "b")}
    named = sorted(p for _, _, processes, _ in sent for p in processes)
    assert named == [RankProcess(r, 100 + r, started[r]) for r in notice.stopped]
    assert all(why.startswith("hang 1 (ray_wandb_nodes on_hang='restart'): ") for *_, why in sent)
