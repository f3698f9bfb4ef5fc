"""The fleet's hang watch over a fake pool (no Ray), on a clock the tests move: one alert a hang
with every rank's evidence asked at once, raised only when fresh readings still show no progress;
one INFO when progress resumes (a rank that finished is progress) or the run ends; a new hang after
that; a restart that ends an attempt once for one place; and what the notice holds."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from ray_wandb_nodes._config.values import OnHang
from ray_wandb_nodes._fleet.hangs import HangWatch, poll_s
from ray_wandb_nodes._hang import (
    HangNotice,
    HangTimeout,
    Phase,
    RankEvidence,
    RankProcess,
    RankProgress,
    hang_notice,
)
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
class Logger:
    """A node's logger as the watch calls it; its status calls (pings out of turn) never answer
    here: a test brings each ping's answer itself (``Pool.ping``)."""

    name: str
    pinged: list[str]

    @property
    def status(self) -> Any:
        return SimpleNamespace(remote=lambda: self.pinged.append(self.name))


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
    refreshed: list[str] = field(default_factory=list)  # the nodes pinged out of turn, in order

    def __post_init__(self) -> None:
        for name, handle in self.handles.items():
            handle.actor = Logger(name, self.refreshed)

    def get(self, node_id: str) -> Handle | None:
        return self.handles.get(node_id)

    def answered(self, refs: list[Any]) -> set[Any]:
        return set()

    def ping(self, node: str, ranks: tuple[RankProgress, ...]) -> None:
        """``node``'s ping answers now with ``ranks``."""
        self.handles[node].progress = {ATTEMPT: ranks}
        self.handles[node].progress_at = self.clock


class Said(Warner):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def warn(self, key: str, message: str) -> None:
        self.said.append(message)


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
    assert notices == [] and asked == [] and pool.refreshed == []  # within the limit: nothing asked
    assert target.health.ages == {"a": 2.0, "b": 2.0}  # the nodes table's last progress
    pool.clock = 11.0  # the pings are 11 s old: past the limit, if the ranks have not moved since
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert notices == [] and asked == [] and pool.refreshed == ["a", "b"]  # read again first
    for n, ranks in target.ranks.items():  # the fresh pings: still no progress, 12 s now
        pool.ping(n, tuple(progress(r, 12) for r in ranks))
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
    pool.ping("b", (progress(2, 0.1, steps=6), progress(3, 14)))
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR", "INFO"] and notices[1].title == "Hang over: rank 2 progress again"
    assert not notices[1].rows and not notices[1].files


class Watched:
    """One run on nodes a (ranks 0-1) and b (ranks 2-3) with a 10 s limit, its pings, its nodes'
    answers to an evidence round (``answers``: node -> each rank's (age, steps), None: no answer),
    and everything the watch did: notices, warnings, evidence rounds, ends of an attempt."""

    def __init__(self, on_hang: str = "alert") -> None:
        self.target, self.pool = setup({r: 1.0 for r in range(4)})
        self.watch = HangWatch(HangTimeout(seconds=10), OnHang(on_hang), clock=lambda: self.pool.clock)
        self.watch.end_attempt = lambda *args: self.ended.append(args[2])  # type: ignore[method-assign]
        self.notices: list[HangNotice] = []
        self.warner = Said()
        self.rounds = 0
        self.ended: list[tuple[int, ...]] = []
        self.answers: dict[str, dict[int, tuple[float, int]] | None] = {}
        self.pids = {r: 100 + r for r in range(4)}
        self.where = SHARD

    def at(self, t: float) -> Watched:
        self.pool.clock = t
        return self

    def ping(self, node: str, ranks: dict[int, tuple[float, int]]) -> Watched:
        """``node``'s ping now: each rank's (age, steps)."""
        self.pool.ping(node, tuple(self.progress(r, age, steps) for r, (age, steps) in ranks.items()))
        return self

    def progress(self, r: int, age: float, steps: int) -> RankProgress:
        return RankProgress(r, self.pids[r], steps, steps, True, age, Phase.RUNNING, age, 1.0, 12)

    def ask(self, actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        self.rounds += 1
        out: list[Any] = []
        for handle in actors:
            node = next(n for n, h in self.pool.handles.items() if h.actor is handle)
            answer = self.answers.get(node)
            out.append(
                None
                if answer is None
                else tuple(
                    (
                        self.progress(r, age, steps),
                        RankEvidence(r, self.pids[r], 7, native=(ThreadStack(7, self.where, "TrainingThread(f)"),)),
                    )
                    for r, (age, steps) in answer.items()
                )
            )
        return out

    def check(self) -> list[str]:
        """One check; the titles of what it raised."""
        before = len(self.notices)
        self.watch.check(self.target, self.pool, self.warner, self.notices.append, self.ask)  # type: ignore[arg-type]
        return [n.title for n in self.notices[before:]]


def watched(on_hang: str = "alert") -> Watched:
    return Watched(on_hang)


SILENT = {"a": {0: (12.0, 5), 1: (12.0, 5)}, "b": {2: (12.0, 5), 3: (12.0, 5)}}
MOVED = {"a": {0: (0.5, 6), 1: (0.5, 6)}, "b": {2: (0.5, 6), 3: (0.5, 6)}}


@pytest.mark.parametrize(
    ("pings", "answers", "rounds", "titles"),
    [
        # Pings 12 s old of ranks 1 s silent: suspected, read again, they moved: not a word.
        ({"a": {0: (0.5, 6), 1: (0.5, 6)}, "b": {2: (0.5, 6), 3: (0.5, 6)}}, MOVED, 0, []),
        # The fresh pings still silent past the limit: an evidence round, whose readings moved
        # (the ranks stepped since the ping): dropped without a word.
        (SILENT, MOVED, 1, []),
        # ... whose readings still show no progress: the hang.
        (SILENT, SILENT, 1, ["Hang: ranks 0-3 stopped"]),
        # Node b gives no answer and a's ranks moved: one silent node makes no hang.
        (SILENT, {"a": MOVED["a"], "b": None}, 1, []),
        # Node b gives no answer and a's ranks are still silent: the hang, b named as silent.
        (SILENT, {"a": SILENT["a"], "b": None}, 1, ["Hang: ranks 0-3 stopped"]),
        # No node answers: nothing fresh proves a hang.
        (SILENT, {"a": None, "b": None}, 1, []),
    ],
)
def test_a_hang_is_raised_only_on_fresh_readings_that_still_show_no_progress(
    pings: dict[str, dict[int, tuple[float, int]]],
    answers: dict[str, dict[int, tuple[float, int]] | None],
    rounds: int,
    titles: list[str],
) -> None:
    w = watched(on_hang="restart")
    assert w.at(11.0).check() == [] and w.pool.refreshed == ["a", "b"] and w.rounds == 0
    for node, ranks in pings.items():
        w.ping(node, ranks)
    w.answers = answers
    assert w.check() == titles
    assert w.rounds == rounds
    if titles:
        assert len(w.ended) == 1 and any("training hangs" in m for m in w.warner.said)
        if answers["b"] is None:
            assert "; no answer from node-b." in dict(w.notices[0].files)["verdict.txt"]
    else:  # no alert, no warning, no restart
        assert w.notices == [] and w.warner.said == [] and w.ended == [] and not w.watch.open


def test_a_suspicion_the_evidence_refuted_waits_its_back_off_before_the_next_round() -> None:
    """A rank whose node answers pings but not the evidence round (its ranks' readings past the
    limit, the other node's ranks moving): every node is not asked again on every poll."""
    w = watched()
    w.answers = {"a": MOVED["a"], "b": None}
    w.at(11.0).ping("a", {0: (0.5, 6), 1: (0.5, 6)}).ping("b", SILENT["b"])
    assert w.check() == [] and w.rounds == 1
    for t in (12.0, 15.0, 20.9):  # within the 10 s back-off: the same suspicion waits
        w.at(t).ping("a", {0: (0.5, 6), 1: (0.5, 6)}).ping("b", {2: (t + 1, 5), 3: (t + 1, 5)})
        assert w.check() == [] and w.rounds == 1
    w.at(21.0).ping("a", {0: (0.5, 7), 1: (0.5, 7)}).ping("b", {2: (22.0, 5), 3: (22.0, 5)})
    assert w.check() == [] and w.rounds == 2
    w.at(40.9).ping("b", {2: (41.9, 5), 3: (41.9, 5)}).ping("a", {0: (0.5, 8), 1: (0.5, 8)})
    assert w.check() == [] and w.rounds == 2  # twice in a row: 20 s
    w.at(41.0).ping("a", {0: (0.5, 9), 1: (0.5, 9)})
    assert w.check() == [] and w.rounds == 3
    assert w.notices == [] and w.warner.said == []


def test_a_restart_ends_an_attempt_once_for_one_place_and_names_both_hangs_when_it_stops_there_again() -> None:
    w = watched(on_hang="restart")
    # Attempt 1 runs from scratch, reports a checkpoint with its 3rd report, stops at its 5th.
    w.watch.checkpoint_reports = 3  # (the Checkpointed command: the Train controller's after_report)
    w.answers = SILENT
    w.at(11.0).ping("a", SILENT["a"]).ping("b", SILENT["b"])
    assert w.check() == ["Hang: ranks 0-3 stopped"] and w.ended == [(0, 1, 2, 3)]
    assert "The attempt is ended so that Ray Train restarts it" in w.notices[0].text
    # Ray restarts the attempt from that checkpoint: new processes, counting from zero.
    w.pids = {r: 500 + r for r in range(4)}
    w.watch.checkpoint_reports = 0  # (Checkpointed(run, 0): the attempt started)
    w.at(12.0).ping("a", {0: (1.0, 0), 1: (1.0, 0)}).ping("b", {2: (1.0, 0), 3: (1.0, 0)})
    assert w.check() == [] and not w.watch.open  # the new attempt closed hang 1
    # It stops at its 2nd report: 2 after the checkpoint, as attempt 1 did. Alerted, not ended.
    w.answers = {n: {r: (12.0, 2) for r in ranks} for n, ranks in SILENT.items()}
    w.at(30.0).ping("a", {0: (12.0, 2), 1: (12.0, 2)}).ping("b", {2: (12.0, 2), 3: (12.0, 2)})
    assert w.check() == ["Hang: ranks 0-3 stopped"]
    assert w.ended == [(0, 1, 2, 3)]  # not ended again
    text = w.notices[1].text
    assert (
        "The attempt before this one stopped at the same place in hang 1, which ended it: load_next_shard "
        "(train.py:71), 2 reports after the checkpoint its attempt ran from. This attempt is not ended: "
        "on_hang='restart' ends one attempt a place."
    ) in text and "hangs/hang-2/" in text
    # This hang is alerted like any: progress again ends it with an INFO.
    w.at(31.0).ping("a", {0: (0.1, 3), 1: (0.1, 3)})
    assert w.check() == ["Hang over: ranks 0-1 progress again"]
    # Another attempt that stops at another place (another report since its checkpoint) is ended.
    w.pids = {r: 900 + r for r in range(4)}
    w.at(32.0).ping("a", {0: (1.0, 0), 1: (1.0, 0)}).ping("b", {2: (1.0, 0), 3: (1.0, 0)})
    w.check()
    w.answers = {n: {r: (12.0, 7) for r in ranks} for n, ranks in SILENT.items()}
    w.at(50.0).ping("a", {0: (12.0, 7), 1: (12.0, 7)}).ping("b", {2: (12.0, 7), 3: (12.0, 7)})
    assert w.check() == ["Hang: ranks 0-3 stopped"] and len(w.ended) == 2


def test_a_rank_that_finished_is_progress_and_a_rank_that_failed_is_not() -> None:
    w = watched()
    w.answers = SILENT
    w.at(11.0).ping("a", SILENT["a"]).ping("b", SILENT["b"])
    assert w.check() == ["Hang: ranks 0-3 stopped"]
    w.watch.finished = frozenset()  # ranks 2-3 failed (Train's poll: not running, with an error)
    assert w.at(12.0).check() == []
    w.watch.finished = frozenset({2, 3})  # they returned from their train function
    assert w.check() == ["Hang over: ranks 2-3 progress again"]
    assert w.notices[-1].text == "Progress resumed 1 s after hang 1 was raised: ranks 2-3 finished training."


@pytest.mark.parametrize(
    ("on_hang", "then", "closing"),
    [
        # The run ends with the hang open and no rank moved: closed with the run.
        ("alert", None, ("Hang over: the run ended",
                         "The run ended 9 s after hang 1 was raised, with no progress of ranks 0-3 since.")),
        # Its ranks returned (progress no ping saw: the run ended first): "progress again".
        ("alert", frozenset({0, 1, 2, 3}),
         ("Hang over: ranks 0-3 progress again",
          "Progress resumed 9 s after hang 1 was raised: ranks 0-3 finished training.")),
        # The attempt was ended (on_hang="restart"): that closed it, as a restart does.
        ("restart", None, None),
    ],
)  # fmt: skip
def test_the_runs_end_closes_an_open_hang_before_the_primary_finishes(
    on_hang: str, then: frozenset[int] | None, closing: tuple[str, str] | None
) -> None:
    w = watched(on_hang)
    w.answers = SILENT
    w.at(11.0).ping("a", SILENT["a"]).ping("b", SILENT["b"])
    assert w.check() == ["Hang: ranks 0-3 stopped"]
    if then is not None:
        w.watch.finished = then
    w.at(20.0).watch.close(w.target, w.pool, w.notices.append)  # type: ignore[arg-type]
    assert [(n.title, n.text) for n in w.notices[1:]] == ([closing] if closing else [])
    assert not w.watch.open
    w.watch.close(w.target, w.pool, w.notices.append)  # type: ignore[arg-type]
    assert len(w.notices) == (2 if closing else 1)  # once


def test_the_poll_sees_a_short_limit_within_a_sixteenth_of_it() -> None:
    assert poll_s(HangTimeout(seconds=4), 3.0) == 0.25 and poll_s(HangTimeout(seconds=32), 3.0) == 2.0
    assert poll_s(HangTimeout(auto=True), 3.0) == 3.0 and poll_s(HangTimeout(seconds=600), 3.0) == 3.0


def test_the_notice_names_the_stopped_ranks_their_node_gpu_and_when() -> None:
    from ray_wandb_nodes._hang import RankFacts

    facts = [RankFacts(progress(r, 65.0, steps=8), evidence_of(r), f"node-{r}", (str(r),)) for r in range(2)]
    now = datetime.datetime(2026, 12, 4, 12, 0, 0, tzinfo=datetime.timezone.utc)
    notice = hang_notice(judge(facts), facts, 3, OnHang.RESTART, now=now)
    assert notice.folder == "hangs/hang-3" and notice.stopped == (0, 1)
    assert "rank 1 on node-1 GPU 1: last progress at step 8, report 5, since 11:58:55 UTC" in notice.text
    assert "on_hang='restart'" in notice.text
    rank_file = dict(notice.files)["rank-1.txt"]
    assert "rank 1 (pid 101) on node-1, GPU 1" in rank_file and "load_next_shard" in rank_file
    assert notice.table()[0][:7] == [0, "node-0", "0", 8, 5, 65.0, "stuck"]


def test_a_restarted_attempt_ends_the_episode_without_an_alert_and_can_hang_again() -> None:
    target, pool = setup({0: 20, 1: 20, 2: 20, 3: 20})
    watch = HangWatch(HangTimeout(seconds=10), on_hang=OnHang.ALERT, clock=lambda: pool.clock)
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
    pool.clock = 40.0  # pings after the restart: the new attempt stopped too
    for n, handle in pool.handles.items():
        pool.ping(n, tuple(progress(p.rank, 40.0) for p in handle.progress[ATTEMPT]))
    watch.check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    assert [n.level for n in notices] == ["ERROR", "ERROR"] and notices[1].episode == 2


def test_after_restart_ends_an_attempt_a_waiter_let_go_is_no_progress() -> None:
    watch = HangWatch(HangTimeout(seconds=10), on_hang=OnHang.RESTART)
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
    monkeypatch.setattr("ray_wandb_nodes._fleet.hang_ends._await_ends", lambda pending, warner: awaited.append(pending))
    started = {0: 7001, 1: 7002, 2: 7003, 3: 7004}

    def ask(actors: list[Any], key: str, ranks: list[list[int]]) -> list[Any]:
        assert key == ATTEMPT
        fresh = [
            tuple((replace(progress(r, 20), proc_start=started[r]), evidence_of(r)) for r in mine) for mine in ranks
        ]
        fresh[1] = (fresh[1][0], (replace(progress(3, 0.5, steps=9), proc_start=started[3]), evidence_of(3)))
        return fresh

    notices: list[HangNotice] = []
    HangWatch(HangTimeout(seconds=10), on_hang=OnHang.RESTART).check(target, pool, Warner(), notices.append, ask)  # type: ignore[arg-type]
    [notice] = notices
    assert notice.stopped and len(awaited) == 1
    assert {(node, key) for node, key, _, _ in sent} == {(n, ATTEMPT) for n in ("a", "b")}
    named = sorted(p for _, _, processes, _ in sent for p in processes)
    assert named == [RankProcess(r, 100 + r, started[r]) for r in notice.stopped]
    assert all(why.startswith("hang 1 (ray_wandb_nodes on_hang='restart'): ") for *_, why in sent)
