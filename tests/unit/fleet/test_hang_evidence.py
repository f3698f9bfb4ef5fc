"""The fleet's side of hang detection (``_fleet/hangs.py``) over simulated nodes whose answers are
made from real captured evidence (``tests/support/hang_fixtures.sim_run``)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from ray_wandb_nodes._fleet.hangs import HangWatch
from ray_wandb_nodes._hang import HangNotice, HangTimeout
from ray_wandb_nodes._warn import Warner
from tests.support.hang_fixtures import SimRun, sim_run


def raise_hang(run: SimRun, ask: Any = None) -> list[HangNotice]:
    notices: list[HangNotice] = []
    HangWatch(HangTimeout(seconds=60.0)).check(run.target, run.pool, Warner(), notices.append, ask=ask or run.ask)
    return notices


def test_every_nodes_answer_reaches_the_verdict_and_the_notice() -> None:
    run = sim_run("python", nodes=4)  # 32 ranks, rank 19 stuck
    (notice,) = raise_hang(run)
    assert notice.text.startswith(
        "ranks 0-18,20-31 wait in all_reduce #5 (hang_rank.py:63); rank 19 never entered it: in load_next_shard"
    )
    assert notice.stopped == (19,) and len(notice.rows) == 32 and len(notice.files) == 33
    assert {r.node for r in notice.rows} == {f"node-{n}" for n in range(4)}
    assert "\nEvidence: 32 ranks, asked at once, in " in dict(notice.files)["verdict.txt"]


def test_a_node_that_gives_no_evidence_is_named_in_the_verdict_and_its_ranks_files() -> None:
    run = sim_run("python", nodes=4)

    def node_2_silent(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        answers = run.ask(actors, run_id, ranks)
        return [None if i == 2 else a for i, a in enumerate(answers)]

    (notice,) = raise_hang(run, ask=node_2_silent)
    files = dict(notice.files)
    assert "; no answer from node-2." in files["verdict.txt"]
    silent = [r.rank for r in notice.rows if r.node == "node-2"]
    assert silent and all("no evidence came back from this rank's node" in files[f"rank-{r}.txt"] for r in silent)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_held_off_while_the_evidence_is_unpickled_and_judged(enabled: bool) -> None:
    """Millions of new objects at 1,000 nodes: each full collection walks the whole heap (check()
    to the notice 3.1 s with it, 0.6 s without at 8,000 ranks). Afterwards it is as it was."""
    run = sim_run("python", nodes=2)
    seen = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        seen.append(gc.isenabled())
        return run.ask(actors, run_id, ranks)

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert len(raise_hang(run, ask)) == 1
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_the_alert_names_forty_stopped_ranks_and_counts_the_rest() -> None:
    """Every rank of a large job stuck in one place: the alert stays short (8,000 ranks named one a
    line made 0.6 MB); verdict.txt and the hangs table keep every rank."""
    (notice,) = raise_hang(sim_run("all", nodes=8))  # 64 ranks, all in load_next_shard
    assert notice.text.startswith("every rank (0-63) is in load_next_shard (hang_rank.py:35)")
    named = [line for line in notice.text.splitlines() if line.startswith("rank ")]
    assert [line.split()[1] for line in named] == [str(r) for r in range(40)]
    assert "and 24 more ranks (every rank is in the hangs table and verdict.txt)" in notice.text
    verdict_file = dict(notice.files)["verdict.txt"]
    assert all(f"rank {r} on node-{r // 8} GPU {r % 8}:" in verdict_file for r in range(64))
    assert len(notice.rows) == 64 and notice.stopped == tuple(range(64))


def test_the_evidence_is_freed_before_the_collector_is_back() -> None:
    """Freed while the collector is held off, the evidence is not walked by its first collection
    after (every object allocated in the pause is in its youngest generation)."""
    run = sim_run("python", nodes=2)
    answers: list[weakref.ref[Any]] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        got = run.ask(actors, run_id, ranks)
        answers.extend(weakref.ref(evidence) for answer in got for _, evidence in answer)
        return got

    alive_at_delivery = []

    def deliver(notice: HangNotice) -> None:
        alive_at_delivery.append(sum(ref() is not None for ref in answers))

    HangWatch(HangTimeout(seconds=60.0)).check(run.target, run.pool, Warner(), deliver, ask=ask)
    assert len(answers) == 16 and alive_at_delivery == [0]


def test_past_64_ranks_the_stopped_ranks_keep_their_files_and_every_rank_is_in_one() -> None:
    run = sim_run("python", nodes=9)  # 72 ranks, one stuck
    (notice,) = raise_hang(run)
    files = dict(notice.files)
    assert sorted(files) == ["all-ranks.txt", *(f"rank-{r}.txt" for r in notice.stopped), "verdict.txt"]
    headers = [line.split(" (pid")[0] for line in files["all-ranks.txt"].splitlines() if " (pid " in line]
    assert headers == [f"rank {r}" for r in range(72)]  # every rank once, in rank order
    assert files[f"rank-{notice.stopped[0]}.txt"] in files["all-ranks.txt"]
