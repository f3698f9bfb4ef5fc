"""Hang evidence from real processes, without Ray: three ranks of torch.distributed over gloo on
this machine, each armed as a Train worker is (``tests/support/hang_rank.py``); one rank stops
before a step's all_reduce while the others wait in it. From outside, the test reads the beacon
slots, asks every rank for its evidence at once, and judges."""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ray_wandb_nodes._hang.beacon import BeaconSlot, default_root, progress_of
from ray_wandb_nodes._hang.dumps import request_dumps
from ray_wandb_nodes._hang.evidence import RankEvidence
from ray_wandb_nodes._hang.node import DUMPS_TIMEOUT_S
from ray_wandb_nodes._hang.position import Kind, RankFacts, position
from ray_wandb_nodes._hang.verdict import judge
from tests.support.hang_world import rank_processes
from tests.support.hang_world import settled as settle_ranks
from tests.support.source import line_of

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = REPO / "tests" / "support" / "hang_rank.py"
WORLD, STUCK, AT = 3, 2, 4


@contextlib.contextmanager
def ranks(mode: str, lib: str = "", world: int = WORLD, stuck: int = STUCK) -> Iterator[Path]:
    """``world`` rank processes in ``mode``, killed (each by its pid) when the test ends."""
    directory = Path(tempfile.mkdtemp(dir=default_root(), prefix="rwn-hang-test-"))
    try:
        with rank_processes(directory, mode, world, stuck, AT, lib):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def settled(directory: Path, world: int = WORLD) -> list[BeaconSlot]:
    """The slots once every rank reached step ``AT`` and has been silent a second."""
    return settle_ranks(directory, world, AT)


def facts_of(slots: list[BeaconSlot], evidence: list[RankEvidence]) -> list[RankFacts]:
    now = time.monotonic_ns()
    by_rank = {e.rank: e for e in evidence}
    return [RankFacts(progress_of(s, now), by_rank[s.rank], node=f"node-{s.rank}", gpus=()) for s in slots]


def test_a_rank_stuck_in_a_python_function_while_the_others_wait_in_all_reduce() -> None:
    started = time.monotonic()
    with ranks("python") as directory:
        slots = settled(directory)
        evidence = request_dumps(slots, timeout_s=10)
        for e in evidence:  # Python could run in every rank: named stacks and the recorder, never signalled
            assert e.python and not e.native and e.flight is not None, e.notes
            assert e.python[0].ident == e.training_ident or any(s.ident == e.training_ident for s in e.python)
        verdict = judge(facts_of(slots, evidence))
    seq = AT + 1  # one all_reduce a step: the waiters' next is #AT+1
    expected = (
        f"ranks 0-1 wait in all_reduce #{seq} (hang_rank.py:{line_of(RANK_SCRIPT, 'all_reduce')}); "
        f"rank {STUCK} never entered it: in load_next_shard (hang_rank.py:{line_of(RANK_SCRIPT, 'load_next_shard')}), "
        "no progress for "
    )
    assert verdict.sentence.startswith(expected), verdict.sentence
    assert re.fullmatch(r".*no progress for \d+ s", verdict.sentence)
    assert (verdict.stopped, verdict.waiting) == ((STUCK,), (0, 1))
    rows = {r.rank: r for r in verdict.rows}
    assert (rows[0].collective, rows[0].seq, rows[0].state, rows[0].last_step) == ("all_reduce", seq, "waits", AT)
    assert (rows[STUCK].collective, rows[STUCK].seq, rows[STUCK].state) == ("", None, "stopped")
    assert rows[STUCK].where == f"load_next_shard (hang_rank.py:{line_of(RANK_SCRIPT, 'load_next_shard')})"
    # The stuck rank's recorder ends one collective earlier: all it enqueued completed.
    stuck = next(e for e in evidence if e.rank == STUCK)
    assert stuck.flight is not None and stuck.flight.in_flight() == []
    assert stuck.flight.last_seq("0") == AT
    print(f"python case: {time.monotonic() - started:.1f} s: {verdict.sentence}")


def test_a_rank_stuck_in_native_code_that_holds_the_gil_is_named_from_its_faulthandler_dump(gil_lib: str) -> None:
    started = time.monotonic()
    with ranks("native", gil_lib) as directory:
        slots = settled(directory)
        # A node's own bound on a round (DUMPS_TIMEOUT_S, 5 s; this test had 4): the round ends as
        # soon as every rank answered, so the bound only gives the waiters' dumps (their flight
        # recorders, the all_reduce's number) room on a loaded machine.
        evidence = request_dumps(slots, timeout_s=DUMPS_TIMEOUT_S)
        verdict = judge(facts_of(slots, evidence))
    stuck = next(e for e in evidence if e.rank == STUCK)
    # Its Python could not run: no dump thread, no recorder, but faulthandler's C-level dump.
    assert stuck.python == () and stuck.flight is None and stuck.native
    # Its request was taken back unread before the signal: its dump thread will never answer it.
    assert "its dump thread did not take the request in time (Python could not run)" in stuck.notes
    where = position(next(f for f in facts_of(slots, evidence) if f.progress.rank == STUCK))
    assert where.kind is Kind.ELSEWHERE
    assert (where.where and where.where.function, where.where and where.where.line) == (
        "read_from_device",
        line_of(RANK_SCRIPT, "read_from_device"),
    )
    assert verdict.sentence.startswith(
        f"ranks 0-1 wait in all_reduce #{AT + 1} (hang_rank.py:{line_of(RANK_SCRIPT, 'all_reduce')}); rank {STUCK} "
    ), verdict.sentence
    # Without its recorder the verdict cannot say it never entered: it says it is not in it.
    assert (
        f"is not in it: in read_from_device (hang_rank.py:{line_of(RANK_SCRIPT, 'read_from_device')})"
        in verdict.sentence
    )
    assert verdict.stopped == (STUCK,)
    print(f"native case: {time.monotonic() - started:.1f} s: {verdict.sentence}")
