"""The first death, chosen from tables of per-rank failures built from real evidence: four gloo
ranks (torch 2.13) whose rank 1 was SIGKILLed, raised while the others waited, or raised with
rank 3 at once, and Ray Train V2's own poll of a kill and of a node lost (see ``tests/support/failure_fixtures.py``)."""

from __future__ import annotations

from ray_wandb_nodes._failure import (
    Gone,
    Kind,
    NodeFacts,
    RankFailure,
    RankPlace,
    RayPoll,
    RayRankError,
    Shape,
    Window,
    choose,
    rank_failures,
    shape_of,
)
from tests.support.failure_fixtures import (
    RANK_SCRIPT,
    gone,
    nodes,
    places,
    ray_captures,
    ray_nodes,
    ray_places,
    ray_poll,
    record_error,
)
from tests.support.source import line_of


def ray_death_text() -> str:
    """Ray 2.60's words for the SIGKILLed rank of its own capture (an ``ActorDiedError``)."""
    error = next(e for e in ray_captures()["kill"]["poll"]["errors"] if e["died"])
    return str(error["message"])


def ranks_of(failures: tuple[RankFailure, ...]) -> list[int]:
    return [f.rank for f in failures]


# A kill and its cascade ------------------------------------------------------------------------
def test_a_kill_is_the_cause_and_the_collective_errors_after_it_its_consequence() -> None:
    # Ray saw the death and two peers' all_reduce failing on the poll it decided on; rank 3 had
    # answered running and failed after.
    poll = RayPoll((record_error("kill", 0), RayRankError(1, "ActorDiedError", ray_death_text(), died=True),
                    record_error("kill", 2)), running=(3,))  # fmt: skip
    verdict = choose(rank_failures(places("kill"), poll, nodes("kill")))
    assert verdict.first is not None and verdict.first.ranks == (1,) and len(verdict.causes) == 1
    cause = verdict.first.failure
    assert (cause.kind, cause.node, cause.gpus) == (Kind.SIGNAL, "node-0", ("1",))
    assert "Worker exit type: SYSTEM_ERROR" in cause.message
    assert ranks_of(verdict.consequences) == [0, 2, 3]
    assert {f.shape for f in verdict.consequences} == {Shape.PEER_CLOSED}


def test_a_kill_that_ray_had_not_seen_yet_is_named_from_its_node() -> None:
    # The cascade reached Ray's poll first: only the peers' errors, rank 1's poll unanswered.
    # Its node had found its process gone, with no record of its own: a death without Python.
    killed = next(g for g in gone("kill") if g.rank == 1)
    poll = RayPoll((record_error("kill", 0), record_error("kill", 2)), running=(3,), unanswered=(1,))
    verdict = choose(rank_failures(places("kill"), poll, nodes("kill", before_ns=killed.gone_ns)))
    assert verdict.first is not None and verdict.first.ranks == (1,)
    assert verdict.first.failure.kind is Kind.SIGNAL and not verdict.first.failure.by_ray
    assert verdict.first.failure.window == Window(killed.alive_ns, killed.gone_ns)
    assert ranks_of(verdict.consequences) == [0, 2, 3]


def test_with_only_the_cascade_seen_no_rank_is_blamed() -> None:
    poll = RayPoll((record_error("kill", 0), record_error("kill", 2)), running=(3,), unanswered=(1,))
    verdict = choose(rank_failures(places("kill"), poll))
    assert not verdict.cause_seen
    assert ranks_of(verdict.consequences) == [0, 2]


def test_ray_s_own_poll_of_a_kill() -> None:
    capture = ray_captures()["kill"]
    verdict = choose(rank_failures(ray_places("kill"), ray_poll("kill")))
    assert verdict.first is not None and verdict.first.ranks == (1,), verdict
    assert verdict.first.failure.kind is Kind.SIGNAL
    assert all(f.shape.follows for f in verdict.consequences)
    assert capture["decision"] == "RAISE"


# Two ranks at once, a raise while the others wait ------------------------------------------------
def test_two_ranks_failing_at_once_are_both_causes() -> None:
    poll = RayPoll((record_error("two", 1), record_error("two", 3)), running=(0, 2))
    verdict = choose(rank_failures(places("two"), poll, nodes("two")))
    assert [c.ranks for c in verdict.causes] == [(1,), (3,)]
    first, second = (c.failure for c in verdict.causes)
    assert (first.error_type, first.message, first.frame and first.frame.function) == (
        "ValueError", "bad shard 17", "load_shard")  # fmt: skip
    assert (second.error_type, second.frame and second.frame.place) == (
        "KeyError",
        f"crash_rank.py:{line_of(RANK_SCRIPT, 'read_labels')}",
    )
    assert ranks_of(verdict.consequences) == [0, 2]


def test_two_raises_on_one_node_are_both_causes_whatever_their_order() -> None:
    # Ranks 1 and 3 raised 1.4 ms apart on one clock: a raise is not felt by the others until
    # its process ends, so neither follows the other.
    same_node = [RankPlace(p.rank, "node-0", p.gpus, p.pid) for p in places("two")]
    records = nodes("two")
    facts = NodeFacts(records["node-0"].records + records["node-1"].records, (), 0)
    verdict = choose(rank_failures(same_node, RayPoll((), running=(0, 2), unanswered=(1, 3)), {"node-0": facts}))
    assert [c.ranks for c in verdict.causes] == [(1,), (3,)]


def test_in_real_train_workers_the_hook_records_the_raise_and_what_followed_it() -> None:
    # Ray 2.60: the ranks that waited failed in all_reduce as Ray shut the group down (their own
    # records say so; Ray's poll had them running): consequences.
    records = [r for facts in ray_nodes("raise").values() for r in facts.records]
    raised = next(r for r in records if r.rank == 1)
    assert raised.frame is not None and raised.frame.function == "train_loop"
    assert raised.thread.startswith("TrainingThread(")
    verdict = choose(rank_failures(ray_places("raise"), ray_poll("raise"), ray_nodes("raise")))
    assert verdict.first is not None and verdict.first.ranks == (1,)
    assert verdict.first.failure.traceback == raised.traceback  # the rank's own, whole
    assert ranks_of(verdict.consequences) == sorted(r.rank for r in records if r.rank != 1)
    assert all(f.alive_after and f.shape is Shape.PEER_CLOSED for f in verdict.consequences)


def test_a_rank_that_raised_while_the_others_waited_in_all_reduce() -> None:
    # Ray saw rank 1's raise; the others answered running, then gloo timed them out.
    poll = RayPoll((record_error("raise", 1),), running=(0, 2, 3))
    verdict = choose(rank_failures(places("raise"), poll, nodes("raise")))
    assert verdict.first is not None and verdict.first.ranks == (1,)
    frame = verdict.first.failure.frame
    assert frame is not None and frame.place == f"crash_rank.py:{line_of(RANK_SCRIPT, 'load_shard')}"
    assert frame.code == 'raise ValueError(f"bad shard {index}")  # <load_shard>'
    assert ranks_of(verdict.consequences) == [0, 2, 3]
    assert {f.shape for f in verdict.consequences} == {Shape.PEER_TIMEOUT}


def test_a_raise_seen_by_ray_alone_names_the_innermost_user_frame_from_ray_s_traceback() -> None:
    poll = ray_poll("raise")
    verdict = choose(rank_failures(ray_places("raise"), poll))
    assert verdict.first is not None and verdict.first.ranks == (1,)
    failure = verdict.first.failure
    assert (failure.error_type, failure.message) == ("ValueError", "bad shard 17")
    assert failure.frame is not None and failure.frame.function == "train_loop"
    assert verdict.consequences == ()


def test_a_raise_after_a_kill_on_its_node_follows_it() -> None:
    # Any failure of its own that certainly came after a death on the same node is its consequence.
    kill = RankFailure(1, "node-0", (), Kind.SIGNAL, window=Window(100, 200))
    later = RankFailure(0, "node-0", (), Kind.RAISED, error_type="OSError", message="pipe", window=Window(300, 300))
    elsewhere = RankFailure(2, "node-1", (), Kind.RAISED, error_type="OSError", message="pipe", window=Window(300, 300))
    verdict = choose([later, kill, elsewhere])
    assert [c.ranks for c in verdict.causes] == [(1,), (2,)]
    assert ranks_of(verdict.consequences) == [0]


# OOM kills, a node lost ---------------------------------------------------------------------------
def test_an_oom_kill_named_from_the_node_s_cgroup() -> None:
    poll = RayPoll((record_error("kill", 0), RayRankError(1, "ActorDiedError", ray_death_text(), died=True),
                    record_error("kill", 2)), running=(3,))  # fmt: skip
    facts = nodes("kill", oom_kills={"node-0": 1}, oom_at_death={1: 1}, memory={"node-0": 97.0})
    cause = choose(rank_failures(places("kill"), poll, facts)).first
    assert cause is not None and cause.failure.kind is Kind.OOM
    assert cause.failure.oom is not None
    assert (cause.failure.oom.at_death, cause.failure.oom.memory_percent) == (1, 97.0)


def test_an_oom_kill_on_another_node_is_not_this_rank_s() -> None:
    poll = RayPoll((RayRankError(1, "ActorDiedError", ray_death_text(), died=True),), running=(0, 2, 3))
    facts = nodes("kill", oom_kills={"node-1": 2})
    cause = choose(rank_failures(places("kill"), poll, facts)).first
    assert cause is not None and cause.failure.kind is Kind.SIGNAL


def test_only_an_oom_kill_counted_as_the_process_died_makes_it_one() -> None:
    # The node counted 2 OOM kills during the run (another process, earlier), none as rank 1 died.
    killed = next(g for g in gone("kill") if g.rank == 1)
    facts = nodes("kill", ranks={0, 2, 3}, oom_kills={"node-0": 2})
    for kills, kind in ((0, Kind.SIGNAL), (1, Kind.OOM)):
        dead = Gone(killed.rank, killed.pid, killed.alive_ns, killed.gone_ns, oom_kills=kills)
        node0 = NodeFacts(facts["node-0"].records, (dead,), 2)
        poll = RayPoll((record_error("kill", 0), record_error("kill", 2)), running=(3,), unanswered=(1,))
        cause = choose(rank_failures(places("kill"), poll, {**facts, "node-0": node0})).first
        assert cause is not None and cause.failure.kind is kind
        assert cause.failure.oom is not None and cause.failure.oom.at_death == kills


def test_a_death_ray_saw_with_no_window_takes_the_run_s_count() -> None:
    # No look of its node's around the death (only Ray's account): the run's count is the evidence.
    poll = RayPoll((RayRankError(1, "ActorDiedError", ray_death_text(), died=True),), running=(0, 2, 3))
    facts = {"node-0": NodeFacts((), (), 1)}
    cause = choose(rank_failures(places("kill"), poll, facts)).first
    assert cause is not None and cause.failure.kind is Kind.OOM and cause.failure.oom is not None
    assert (cause.failure.oom.cgroup_oom_kills, cause.failure.oom.at_death) == (1, None)


def test_ray_s_memory_monitor_kill() -> None:
    error = RayRankError(**{**ray_captures()["oom"]["error"], "causes": ()})
    poll = RayPoll((error,), running=(0, 2, 3))
    cause = choose(rank_failures(places("kill"), poll)).first
    assert cause is not None and cause.failure.kind is Kind.OOM
    oom = cause.failure.oom
    assert oom is not None and oom.ray_monitor.startswith("Memory on the node (IP: ")
    assert oom.process_gb is not None and oom.process_gb > 1.0


def test_a_node_lost_with_its_ranks_is_one_cause() -> None:
    capture = ray_captures()["lost"]
    doomed = f"node-{capture['doomed_node'][:8]}"
    on_doomed = sorted(p.rank for p in ray_places("lost") if p.node == doomed)
    verdict = choose(rank_failures(ray_places("lost"), ray_poll("lost"), lost=[doomed]))
    assert verdict.first is not None and verdict.first.ranks == tuple(on_doomed)
    assert verdict.first.failure.kind is Kind.LOST and verdict.first.nodes == (doomed,)
    assert len(verdict.causes) == 1
    assert all(f.shape is Shape.PEER_CLOSED and f.node != doomed for f in verdict.consequences)


def test_ray_s_poll_of_a_lost_node_shows_only_the_cascade() -> None:
    # Why the node's evidence is needed: the poll Ray decided on has only the survivors' errors.
    poll = ray_poll("lost")
    assert poll.errors and all(shape_of(e.error_type, e.message) is Shape.PEER_CLOSED for e in poll.errors)
    assert not choose(rank_failures(ray_places("lost"), poll)).cause_seen


# A healthy job, Ray's own stop ---------------------------------------------------------------------
def test_a_healthy_job_has_no_failure() -> None:
    alive = {n: NodeFacts((), (), 0, 40.0) for n in ("node-0", "node-1")}
    failures = rank_failures(places("kill"), RayPoll((), running=(0, 1, 2, 3)), alive)
    assert failures == []
    assert not choose(failures).cause_seen and choose(failures).consequences == ()


def test_ranks_stopped_by_ray_after_its_decision_are_not_failures() -> None:
    # Rank 1 raised; the others answered running and were killed by Ray's shutdown: gone with
    # no record of their own (the node saw every process gone).
    poll = RayPoll((record_error("raise", 1),), running=(0, 2, 3))
    facts = nodes("raise", ranks={1})
    facts = {n: NodeFacts(f.records, tuple(gone("raise")), 0) for n, f in facts.items()}
    verdict = choose(rank_failures(places("raise"), poll, facts))
    assert verdict.first is not None and verdict.first.ranks == (1,)
    assert verdict.consequences == ()


def test_a_process_gone_after_ray_asked_it_to_stop_is_not_a_death() -> None:
    from ray_wandb_nodes._failure import RankRecord, RecordKind

    stopped = RankRecord(2, 42, RecordKind.STOPPED, 10, 0.0)
    facts = {"node-1": NodeFacts((stopped,), (gone("kill")[0].__class__(2, 42, 5, 20),), 0)}
    failures = rank_failures([RankPlace(2, "node-1", (), 42)], RayPoll((), unanswered=(2,)), facts)
    assert failures == []


def test_records_of_an_earlier_attempt_are_left_out() -> None:
    poll = RayPoll((), running=(0, 1, 2, 3))
    facts = nodes("two")  # the records of processes that are not this attempt's
    later = [RankPlace(p.rank, p.node, p.gpus, (p.pid or 0) + 100_000) for p in places("two")]
    assert rank_failures(later, poll, facts) == []


# The same choice as the quadratic definition, in O(n log n) ----------------------------------------
def reference_choice(failures: list[RankFailure]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The choice as first written (every failure against every other), for small tables."""

    def certainly_before(a: RankFailure, b: RankFailure) -> bool:
        if a.kind is Kind.RAISED or a.node != b.node or a.window is None or b.window is None:
            return False
        return a.window.before(b.window)

    own = [f for f in failures if not f.shape.follows and not f.alive_after]
    if not own:
        own = [f for f in failures if not f.shape.follows]
    first = [f for f in own if not any(certainly_before(g, f) for g in own if g is not f)]
    lost = {f.node for f in first if f.kind is Kind.LOST}
    first += [f for f in failures if f.kind is Kind.LOST and f.node in lost and all(f is not g for g in first)]
    verdict = choose(failures)  # grouping is the same code: compare the chosen ranks
    chosen = sorted(f.rank for f in first)
    assert sorted(r for c in verdict.causes for r in c.ranks) == chosen
    return [c.ranks for c in verdict.causes], [f.rank for f in verdict.consequences]


def test_the_choice_is_the_quadratic_definition_s_on_random_tables() -> None:
    import random

    rng = random.Random(43)
    kinds = [Kind.RAISED, Kind.SIGNAL, Kind.OOM, Kind.LOST, Kind.UNRESPONSIVE]
    for _ in range(400):
        failures = []
        for rank in range(rng.randint(0, 12)):
            after = rng.randint(0, 50)
            window = None if rng.random() < 0.2 else Window(after, after + rng.randint(0, 20))
            kind = rng.choice(kinds)
            shape = rng.choice(list(Shape)) if rng.random() < 0.3 else Shape.OWN
            failures.append(RankFailure(
                rank, f"node-{rng.randint(0, 2)}", (), kind, shape,
                "ValueError" if kind is Kind.RAISED else "", "m", window=window, alive_after=rng.random() < 0.2,
            ))  # fmt: skip
        causes, consequences = reference_choice(failures)
        assert sorted(consequences + [r for c in causes for r in c]) == [f.rank for f in failures]
