"""The fleet's side of failures (``_fleet.failures.FailureWatch``): a failed attempt asks the
nodes of its ranks at once and is decided once they answered, or their time ran out (a lost
node's logger never answers: its ranks are judged from Ray's account and the loss); attempts and
recoveries reach the primary in the order they came; a trial's own failure is left to the Train
run inside it. The nodes and the primary are stand-ins here; their real ones run end to end in
``tests/e2e/test_failures.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ray_wandb_nodes._failure import (
    FailedAttempt,
    FailureNotice,
    NodeFacts,
    RankMemory,
    RankPlace,
    RankRecord,
    RayPoll,
    RayRankError,
    RecordKind,
)
from ray_wandb_nodes._fleet.failures import FACTS_TIMEOUT_S, FailureWatch
from ray_wandb_nodes._warn import Warner

KEY = "run-1.a1.0badcafe"
DIED = "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: x"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Primary:
    spec: Any = field(default_factory=lambda: SimpleNamespace(label="head"))
    told: list[FailureNotice] = field(default_factory=list)

    def failure(self, notice: FailureNotice) -> None:
        self.told.append(notice)


class Pool:
    """Each node's logger: ``failure_facts`` answers at once, later (``held``), or never (``lost``)."""

    def __init__(self, facts: dict[str, NodeFacts], held: set[str] = frozenset(), lost: set[str] = frozenset(),  # type: ignore[assignment]
                 memory: dict[str, float] | None = None,
                 ranks_memory: dict[str, dict[str, tuple[RankMemory, ...]]] | None = None) -> None:  # fmt: skip
        self.facts, self.held, self.lost, self.memory = facts, set(held), set(lost), memory or {}
        self.ranks_memory = ranks_memory or {}
        self.asked: list[tuple[str, str, tuple[int, ...]]] = []

    def get(self, node_id: str) -> Any:
        def remote(key: str, ranks: tuple[int, ...]) -> str:
            self.asked.append((node_id, key, tuple(ranks)))
            return node_id

        actor = SimpleNamespace(failure_facts=SimpleNamespace(remote=remote))
        summaries = {"run-1": SimpleNamespace(mem=self.memory[node_id])} if node_id in self.memory else {}
        return SimpleNamespace(actor=actor, node=SimpleNamespace(label=f"node-{node_id}"), summaries=summaries,
                               ranks_memory=self.ranks_memory.get(node_id, {}))  # fmt: skip

    def answered(self, refs: list[str]) -> set[str]:
        return {r for r in refs if r not in self.held and r not in self.lost}

    def result(self, ref: str) -> NodeFacts:
        if ref not in self.facts:
            raise RuntimeError(f"the logger on {ref} died")  # as Ray says of an actor killed with its rank
        return self.facts[ref]


def target(primary: Primary, relayed: dict[str, tuple[int, ...]] | None = None) -> Any:
    return SimpleNamespace(run_id="run-1", covered_node="head", relayed_ranks=relayed, primary=primary)


def places() -> tuple[tuple[str, RankPlace], ...]:
    return (("a", RankPlace(0, "a?", (), 10)), ("b", RankPlace(1, "b?", (), 20)))


def record(rank: int, pid: int) -> RankRecord:
    return RankRecord(rank, pid, RecordKind.RAISED, 5, 0.0, "ValueError", "bad shard 17", "Traceback ...\n")


def test_a_raise_is_named_from_its_node_s_record_once_every_node_answered() -> None:
    pool = Pool({"a": NodeFacts((), (), 0), "b": NodeFacts((record(1, 20),), (), 0)}, held={"b"})
    primary, watch, clock = Primary(), FailureWatch(clock=Clock()), Clock()
    watch.clock = clock
    poll = RayPoll((RayRankError(1, "ValueError", "bad shard 17"),), running=(0,))
    watch.failed(FailedAttempt(1, True, 1, poll, places(), KEY))
    watch.step(target(primary), pool, Warner())  # type: ignore[arg-type]
    assert sorted(pool.asked) == [("a", KEY, (0,)), ("b", KEY, (1,))] and primary.told == []  # b not yet
    assert watch.busy
    pool.held.clear()
    watch.step(target(primary), pool, Warner())  # type: ignore[arg-type]
    assert [n.title for n in primary.told] == ["Attempt 1: Rank 1 failed: ValueError: bad shard 17"]
    assert primary.told[0].text.startswith("Rank 1 on node-b raised ValueError: bad shard 17")
    assert dict(primary.told[0].files)["rank-1.txt"].endswith("Traceback ...\n")  # the rank's own record's
    assert not watch.busy

    watch.recovered(2)
    watch.step(target(primary), pool, Warner())  # type: ignore[arg-type]
    assert [(n.title, n.level) for n in primary.told][1:] == [("Attempt 2 recovered", "INFO")]


def test_a_node_that_never_answers_is_waited_for_its_time_then_its_ranks_judged_from_ray_s_account() -> None:
    pool = Pool({"a": NodeFacts((), (), None)}, lost={"b"})
    primary, clock = Primary(), Clock()
    watch = FailureWatch(clock=clock)
    poll = RayPoll((RayRankError(1, "ActorDiedError", DIED, died=True),), running=())
    watch.failed(FailedAttempt(1, True, 1, poll, places(), KEY))
    watch.recovered(2)  # the retry reported before the failure was decided: told after it, never before
    watch.step(target(primary), pool, Warner(), alive={"a", "head"})  # type: ignore[arg-type]
    assert primary.told == []
    clock.now += FACTS_TIMEOUT_S
    watch.step(target(primary), pool, Warner(), alive={"a", "head"})  # type: ignore[arg-type]
    notice = primary.told[0]
    # Node b left the cluster: its rank is that loss's (rank 0, alive on node a, no failure).
    assert notice.summary.kind == "lost" and notice.summary.node == "node-b", notice.text
    assert [n.title for n in primary.told] == ["Attempt 1: Rank 1: its node left the cluster", "Attempt 2 recovered"]


def test_a_node_lost_with_its_memory_near_full_at_its_last_sample_reads_as_a_likely_pod_level_oom() -> None:
    poll = RayPoll((RayRankError(1, "ActorDiedError", DIED, died=True),), running=())
    told = {}
    for memory in (97.0, 60.0):  # the last summary the fleet had of node b; 60%: a loss, no memory said
        primary, clock = Primary(), Clock()
        watch = FailureWatch(clock=clock)
        pool = Pool({"a": NodeFacts((), (), None)}, lost={"b"}, memory={"a": 40.0, "b": memory})
        watch.failed(FailedAttempt(1, False, 0, poll, places(), KEY))
        watch.step(target(primary), pool, Warner(), alive={"a", "head"})  # type: ignore[arg-type]
        clock.now += FACTS_TIMEOUT_S
        watch.step(target(primary), pool, Warner(), alive={"a", "head"})  # type: ignore[arg-type]
        told[memory] = primary.told[0].title
    assert told == {
        97.0: "Rank 1: its node left the cluster, likely out of memory (97% in use at its last sample: a pod-level OOM "
        "kill)",
        60.0: "Rank 1: its node left the cluster",
    }


def test_a_trial_s_own_failure_is_left_to_the_train_run_inside_it() -> None:
    primary = Primary()
    watch = FailureWatch()
    watch.failed(FailedAttempt(1, False, 0, None, places(), None, trial=True))
    watch.step(target(primary, relayed={"a": (0, 1)}), Pool({}), Warner())  # type: ignore[arg-type]
    assert primary.told == [] and not watch.busy


def test_a_trial_s_train_run_s_failures_are_taken_once_each_and_its_ranks_watched_without_hangs() -> None:
    """What a Train run inside a Tune trial publishes reaches the trial's run's failure watch as
    the fleet thread reads it (``Relayed``), each event once however often it is read."""
    from bench.fleet_scale import Clock as FleetClock
    from bench.fleet_scale import make_target
    from ray_wandb_nodes._fleet import Relayed
    from ray_wandb_nodes._fleet.targets import take_relayed

    target = make_target(FleetClock())
    target.failures = FailureWatch()
    failed = FailedAttempt(1, True, 1, None, places(), KEY)
    ranks = {"a": (0,), "b": (1,)}
    take_relayed(target, Relayed(ranks, KEY, failures=(failed,)))
    take_relayed(target, Relayed(ranks, KEY, failures=(failed,)))
    take_relayed(target, Relayed(ranks, KEY, failures=(failed, 2)))
    assert list(target.failures._queue) == [failed, 2]
    assert (target.relayed_ranks, target.attempt, target.hangs) == (ranks, KEY, None)


def test_where_ray_s_memory_monitor_killed_the_logger_too_its_last_pings_say_which_rank_grew() -> None:
    """Ray's memory monitor may kill the node's logger with the rank (it prefers actors it can
    restart): the node's last pings carried its ranks' memory, and the alert still says who grew."""
    gib = 1 << 30
    monitor = (
        "Task was killed due to the node running low on memory.\nMemory on the node (IP: 10.0.0.2, ID: b) "
        "where the task (actor ID: x, name=RayTrainWorker.__init__, pid=21, memory used=0.20GB) was "
        "running was 1.52GB / 2.00GB (0.76), which exceeds the memory usage threshold of 0.75."
    )
    grown = (
        RankMemory(1, 21, gib // 5, gib // 5, gib // 5),
        RankMemory(3, 23, gib // 5, int(1.2 * gib), int(1.2 * gib)),
    )
    pool = Pool({"a": NodeFacts((), (), None)}, memory={"b": 76.0}, ranks_memory={"b": {KEY: grown}})
    watch, primary = FailureWatch(clock=Clock()), Primary()
    poll = RayPoll((RayRankError(1, "OutOfMemoryError", monitor, died=True),), running=(0,))
    watch.failed(FailedAttempt(1, False, 0, poll, places(), KEY))
    watch.step(target(primary), pool, Warner(), final=True)  # type: ignore[arg-type]
    (notice,) = primary.told
    assert "out of memory" in notice.text and "Ray's memory monitor" in notice.text, notice.text
    assert "rank 3 grew" in notice.text, notice.text
