"""The rank the others waited for behind a collective timeout (``_failure.stuck``), from tables:
each case is the table Ray's poll and the nodes' facts make, judged as the fleet judges it
(``rank_failures``, ``waited_for``, ``choose``, ``failure_notice``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from ray_wandb_nodes._failure import (
    HangView,
    Kind,
    NodeFacts,
    RankPlace,
    RankRecord,
    RayPoll,
    RayRankError,
    RecordKind,
    UserFrame,
    choose,
    failure_notice,
    rank_failures,
    read_last_words,
    waited_for,
)
from ray_wandb_nodes._failure.node import Gone
from ray_wandb_nodes._hang import Phase, RankProgress

GLOO = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 15000ms for recv operation to complete"
WAITER_TB = (
    "Traceback (most recent call last):\n"
    '  File "/work/train.py", line 40, in train_loop\n'
    "    dist.all_reduce(value)\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper\n'
    "    return func(*args, **kwargs)\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810, in all_reduce\n'
    "    work.wait()\n"
    f"RuntimeError: {GLOO}\n"
)
WHERE = UserFrame("/work/train.py", 37, "load_batch", "lock.acquire()")
PID = 1000


def place(rank: int, per_node: int = 2) -> RankPlace:
    return RankPlace(rank, f"node-{rank // per_node}", (str(rank % per_node),), PID + rank)


def waiter_record(rank: int, seq: int, group: str = "0") -> RankRecord:
    frame = UserFrame("/work/train.py", 40, "train_loop", "dist.all_reduce(value)")
    return RankRecord(rank, PID + rank, RecordKind.RAISED, 10 + rank, time.time(), "RuntimeError", GLOO, WAITER_TB,
                      frame, groups=((group, seq),))  # fmt: skip


def stopped_record(rank: int, seq: int, group: str = "0") -> RankRecord:
    stack = '  File "/work/train.py", line 37, in load_batch\n    lock.acquire()\n'
    return RankRecord(rank, PID + rank, RecordKind.STOPPED, 99, time.time(), traceback=stack, frame=WHERE,
                      groups=((group, seq),))  # fmt: skip


def progress(rank: int, steps: int, age_s: float) -> RankProgress:
    return RankProgress(rank, PID + rank, steps, steps, True, age_s, Phase.RUNNING, age_s, None, 0)


def gloo_poll(waiters: Sequence[int], running: Sequence[int] = ()) -> RayPoll:
    errors = tuple(RayRankError(r, "RuntimeError", GLOO, WAITER_TB) for r in waiters)
    return RayPoll(errors, tuple(running))


def node_facts(records: Sequence[RankRecord], ranks: Sequence[int], per_node: int = 2) -> dict[str, NodeFacts]:
    out: dict[str, NodeFacts] = {}
    for node in sorted({place(r, per_node).node for r in ranks}):
        mine = [r for r in ranks if place(r, per_node).node == node]
        recs = tuple(x for x in records if x.rank in mine)
        prog = tuple(progress(r, 9, 16.0 if r == 1 else 0.1) for r in mine)
        out[node] = NodeFacts(recs, (), 0, None, progress=prog)
    return out


def judged(places: list[RankPlace], poll: RayPoll, facts: dict[str, NodeFacts], hang: HangView | None = None):  # type: ignore[no-untyped-def]
    failures, waited = waited_for(rank_failures(places, poll, facts), places, facts, hang)
    return choose(failures), waited


def test_ranks_that_timed_out_in_a_gloo_all_reduce_name_the_rank_that_never_entered_it() -> None:
    places = [place(r) for r in range(4)]
    records = [waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10), stopped_record(1, 9)]
    verdict, waited = judged(places, gloo_poll((0, 2, 3), running=(1,)), node_facts(records, range(4)))
    assert waited is not None and waited.collective() == "all_reduce #10 of the default group"
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (1,))]
    assert [f.rank for f in verdict.consequences] == [0, 2, 3]
    notice = failure_notice(verdict, waited=waited)
    assert notice.title == "Rank 1 stuck: ranks 0,2-3 timed out waiting in all_reduce #10 of the default group"
    assert "where it stood as Ray stopped it: train.py:37 in load_batch: lock.acquire()" in notice.text
    assert "never entered #10 (its last: #9)" in notice.text
    assert "no progress for 16 s" in notice.text
    assert "ranks 0,2-3: timed out after 15 s in all_reduce #10 of the default group waiting for it" in notice.text
    assert notice.summary.kind == "stuck" and notice.summary.rank == 1


def nccl_tail(rank: int, seq: int) -> str:
    return (
        f"[rank{rank}]:[E1206 07:10:31.41 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=15000) "
        "ran for 15067 milliseconds before timing out.\n"
        f"[rank{rank}]:[E1206 07:10:31.42 ProcessGroupNCCL.cpp:2159] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
        f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, "
        f"last completed NCCL work: {seq - 1}.\n"
        "To avoid data inconsistency, we are taking the entire process down.\n"
        "Fatal Python error: Aborted\n"
    )


def test_waiters_that_nccls_watchdog_aborted_are_its_consequence_and_not_a_sigkill() -> None:
    places = [place(r) for r in range(4)]
    died = "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2"
    poll = RayPoll(tuple(RayRankError(r, "ActorDiedError", died, died=True) for r in (0, 2, 3)), (1,))
    facts = node_facts([stopped_record(1, 9)], range(4))
    for node, f in list(facts.items()):
        dead = [r for r in (0, 2, 3) if place(r).node == node]
        gone = tuple(Gone(r, PID + r, 5, 50) for r in dead)
        words = tuple((r, PID + r, read_last_words(nccl_tail(r, 10))) for r in dead)
        facts[node] = NodeFacts(f.records, gone, 0, None, progress=f.progress, last_words=words)
    failures = rank_failures(places, poll, facts)
    assert {f.rank: (f.signal, f.ended_by) for f in failures if f.rank != 1} == {
        r: ("SIGABRT", "NCCL's watchdog") for r in (0, 2, 3)
    }
    verdict, waited = judged(places, poll, facts)
    assert waited is not None and waited.timeout_s == 15.0
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (1,))]
    notice = failure_notice(verdict, waited=waited)
    assert notice.title.startswith("Rank 1 stuck: ranks 0,2-3 timed out waiting in all_reduce #10")
    assert "SIGKILL" not in notice.text


def test_a_rank_that_raised_on_its_own_stays_the_cause_and_no_rank_is_called_stuck() -> None:
    places = [place(r) for r in range(4)]
    own = RankRecord(1, PID + 1, RecordKind.RAISED, 5, time.time(), "ValueError", "bad shard 17", "",
                     UserFrame("/work/train.py", 12, "load", "raise ValueError"), groups=(("0", 9),))  # fmt: skip
    records = [own, waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10)]
    poll = RayPoll((RayRankError(1, "ValueError", "bad shard 17"), *gloo_poll((0, 2, 3)).errors))
    verdict, waited = judged(places, poll, node_facts(records, range(4)))
    assert waited is None
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.RAISED, (1,))]


def test_no_rank_is_named_where_every_rank_entered_the_collective_or_none_left_its_position() -> None:
    places = [place(r) for r in range(4)]
    level = [waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10), stopped_record(1, 10)]
    verdict, waited = judged(places, gloo_poll((0, 2, 3), running=(1,)), node_facts(level, range(4)))
    assert waited is None and not verdict.causes  # rank 1 entered #10 too: nothing says it held them up
    unknown = [waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10)]  # rank 1 left no record of its stop
    verdict, waited = judged(places, gloo_poll((0, 2, 3), running=(1,)), node_facts(unknown, range(4)))
    assert waited is None and not verdict.causes
    title = failure_notice(verdict).title
    assert title == "Training failed: ranks 0,2-3 failed after a peer; no rank's own failure was seen"


def test_two_ranks_stuck_at_once_on_two_nodes_are_both_named() -> None:
    places = [place(r) for r in range(8)]
    records = [waiter_record(r, 10) for r in (0, 2, 3, 4, 6, 7)] + [stopped_record(1, 9), stopped_record(5, 9)]
    verdict, waited = judged(places, gloo_poll((0, 2, 3, 4, 6, 7), running=(1, 5)), node_facts(records, range(8)))
    assert waited is not None
    assert sorted(r for c in verdict.causes for r in c.ranks) == [1, 5]
    assert all(c.failure.kind is Kind.STUCK for c in verdict.causes)


def test_the_hang_verdict_names_the_stuck_rank_where_it_came_first() -> None:
    places = [place(r) for r in range(4)]
    records = [waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10)]  # rank 1 killed, no record
    hang = HangView((1,), {1: "train.py:37 in load_batch"}, {0: 9, 1: 9, 2: 9, 3: 9}, "all_reduce", 10, "", 1)
    verdict, waited = judged(places, gloo_poll((0, 2, 3), running=(1,)), node_facts(records, range(4)), hang)
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (1,))]
    notice = failure_notice(verdict, waited=waited)
    assert "hang 1 found it stopped at train.py:37 in load_batch" in notice.text
    assert "all_reduce #10 of the default group" in notice.title


def test_a_cascade_of_8000_waiters_behind_one_stuck_rank_is_one_cause_and_a_bounded_alert() -> None:
    n = 8000
    places = [place(r, per_node=8) for r in range(n)]
    records = [waiter_record(r, 10) for r in range(n) if r != 4321] + [stopped_record(4321, 9)]
    facts = node_facts(records, range(n), per_node=8)
    started = time.perf_counter()
    verdict, waited = judged(places, gloo_poll([r for r in range(n) if r != 4321], running=(4321,)), facts)
    notice = failure_notice(verdict, waited=waited)
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (4321,))]
    assert len(verdict.consequences) == n - 1
    assert notice.title.startswith("Rank 4321 stuck: ranks 0-4320,4322-7999 timed out")
    assert len(notice.text) < 4000
    print(f"8,000 ranks: judged and written in {time.perf_counter() - started:.2f} s")


def nccl_facts(places: list[RankPlace], dead: dict[int, str], records: Sequence[RankRecord]) -> dict[str, NodeFacts]:
    """Each node's facts where ``dead`` ranks died leaving ``dead[rank]`` as their log's tail."""
    facts = node_facts(records, [p.rank for p in places])
    for node, f in list(facts.items()):
        mine = [r for r in dead if place(r).node == node]
        gone = tuple(Gone(r, PID + r, 5, 50) for r in mine)
        words = tuple((r, PID + r, read_last_words(dead[r])) for r in mine)
        facts[node] = NodeFacts(f.records, gone, 0, None, progress=f.progress, last_words=words)
    return facts


def died_poll(ranks: Sequence[int], running: Sequence[int] = ()) -> RayPoll:
    died = "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2"
    return RayPoll(tuple(RayRankError(r, "ActorDiedError", died, died=True) for r in ranks), tuple(running))


def nccl_tail_op(rank: int, seq: int, op: str) -> str:
    return nccl_tail(rank, seq).replace("OpType=ALLREDUCE", f"OpType={op}")


def test_a_collective_mismatch_names_the_rank_in_the_other_collective() -> None:
    """Rank 3 entered broadcast #10 while the others entered all_reduce #10: every rank waits at
    the same number, and the one in the other collective is the one the others waited for."""
    places = [place(r) for r in range(4)]
    tails = {r: nccl_tail_op(r, 10, "BROADCAST" if r == 3 else "ALLREDUCE") for r in range(4)}
    verdict, waited = judged(places, died_poll(range(4)), nccl_facts(places, tails, []))
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (3,))]
    assert waited is not None and waited.waiters == (0, 1, 2) and waited.op == "all_reduce"
    assert "entered broadcast #10 where the others entered all_reduce #10" in failure_notice(verdict).text


def test_point_to_point_waits_are_not_compared_with_the_collectives_count() -> None:
    """NCCL numbers send/recv on a counter of its own: a recv #400 says nothing of who is behind."""
    places = [place(r) for r in range(4)]
    tails = {r: nccl_tail_op(r, 400, "RECV") for r in (0, 2, 3)}
    verdict, waited = judged(
        places, died_poll((0, 2, 3), running=(1,)), nccl_facts(places, tails, [stopped_record(1, 50)])
    )
    assert waited is None and not any(c.failure.kind is Kind.STUCK for c in verdict.causes)


def test_a_nccl_rank_aborted_after_its_peer_died_is_that_death_s_consequence() -> None:
    """Rank 1 is SIGKILLed; NCCL's watchdog sees the remote error on 0, 2 and 3 and aborts them:
    one cause (rank 1's death), never the peers' SIGABRT."""
    remote = (
        "[rank0]:[E1206 07:10:31.41 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group "
        "watchdog thread terminated with exception: NCCL error: remote process exited or there was a network error\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
    )
    places = [place(r) for r in range(4)]
    tails = {r: remote for r in (0, 2, 3)}
    tails[1] = ""  # a SIGKILL says nothing
    facts = nccl_facts(places, {r: t for r, t in tails.items() if t}, [])
    facts["node-0"] = NodeFacts(facts["node-0"].records, (*facts["node-0"].gone, Gone(1, PID + 1, 4, 49)), 0, None,
                                last_words=facts["node-0"].last_words)  # fmt: skip
    verdict, _ = judged(places, died_poll(range(4)), facts)
    assert [c.ranks for c in verdict.causes] == [(1,)], [(c.ranks, c.failure.signal) for c in verdict.causes]
    assert {f.rank for f in verdict.consequences} == {0, 2, 3}


def test_a_hang_s_verdict_is_not_taken_where_the_stopped_rank_s_record_says_it_was_not_behind() -> None:
    """A hang of an earlier episode (a long save that resumed) named rank 2; the timeout hours later is
    rank 1's: rank 2's record of Ray's stop shows it entered #10 with the waiters."""
    places = [place(r) for r in range(4)]
    records = [waiter_record(0, 10), waiter_record(3, 10), stopped_record(1, 9), stopped_record(2, 10)]
    hang = HangView((2,), {2: "train.py:80 in save"}, {}, "all_reduce", 10, "", 1)
    verdict, _ = judged(places, gloo_poll((0, 3), running=(1, 2)), node_facts(records, range(4)), hang)
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (1,))]


def test_a_waiter_whose_group_ended_before_its_raise_is_placed_by_its_stop_record() -> None:
    """``finally: dist.destroy_process_group()`` ran before the exception left: its raise has no
    positions, its record of the group's end has them."""
    places = [place(r) for r in range(4)]
    bare = [replace(waiter_record(r, 10), groups=()) for r in (0, 2, 3)]
    ended = [replace(stopped_record(r, 10), frame=None) for r in (0, 2, 3)]
    facts = node_facts([*bare, *ended, stopped_record(1, 9)], range(4))
    verdict, _ = judged(places, gloo_poll((0, 2, 3), running=(1,)), facts)
    assert [(c.failure.kind, c.ranks) for c in verdict.causes] == [(Kind.STUCK, (1,))]


def test_coalesced_point_to_point_work_is_not_compared_with_the_collectives_count() -> None:
    """Batched sends and receives (a pipeline's) are NCCL's COALESCED work, on a counter of its own."""
    places = [place(r) for r in range(4)]
    tails = {r: nccl_tail_op(r, 400, "COALESCED") for r in (0, 2, 3)}
    verdict, waited = judged(
        places, died_poll((0, 2, 3), running=(1,)), nccl_facts(places, tails, [stopped_record(1, 50)])
    )
    assert waited is None and not any(c.failure.kind is Kind.STUCK for c in verdict.causes)


def test_a_rank_behind_but_itself_waiting_in_another_collective_is_not_named_stuck() -> None:
    """Rank 1 is behind the waiters' all_reduce #10 because it waits in a collective of another
    group (a pipeline stage's): it is not the root, and nothing names it."""
    places = [place(r) for r in range(4)]
    stack = WAITER_TB.split("RuntimeError")[0]  # its training thread stood in distributed_c10d's all_reduce
    blocked = RankRecord(1, PID + 1, RecordKind.STOPPED, 99, time.time(), traceback=stack, groups=(("0", 9),))
    records = [waiter_record(0, 10), waiter_record(2, 10), waiter_record(3, 10), blocked]
    verdict, _ = judged(places, gloo_poll((0, 2, 3), running=(1,)), node_facts(records, range(4)))
    assert not any(c.failure.kind is Kind.STUCK for c in verdict.causes)


@pytest.mark.parametrize("in_broadcast", [4, 3])
def test_a_mismatch_with_no_clear_minority_names_no_rank(in_broadcast: int) -> None:
    places = [place(r) for r in range(8)]
    tails = {r: nccl_tail_op(r, 10, "BROADCAST" if r < in_broadcast else "ALLREDUCE") for r in range(8)}
    verdict, waited = judged(places, died_poll(range(8)), nccl_facts(places, tails, []))
    assert waited is None and not any(c.failure.kind is Kind.STUCK for c in verdict.causes)
