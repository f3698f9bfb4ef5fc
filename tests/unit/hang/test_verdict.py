"""The verdict across ranks, from a table of constructed slots and stacks and from real evidence
captured from stuck gloo ranks (``tests/support/hang_evidence/``)."""

from __future__ import annotations

import dataclasses
import datetime
import functools

import pytest

from ray_wandb_nodes._hang.beacon import Phase, RankProgress
from ray_wandb_nodes._hang.evidence import RankEvidence
from ray_wandb_nodes._hang.flight import Collective, FlightRecord, PgStatus, parse_flight_recorder
from ray_wandb_nodes._hang.position import Kind, RankFacts, is_library, position
from ray_wandb_nodes._hang.report import hang_notice
from ray_wandb_nodes._hang.stacks import Frame, ThreadStack
from ray_wandb_nodes._hang.verdict import HangRow, _what, format_stack_groups, judge, rank_ranges
from tests.support.hang_fixtures import capture, filled_ring, many
from tests.support.hang_fixtures import facts as captured

SITE = "/venv/lib/python3.11/site-packages"
USER = "/home/me/train.py"
LOOP = Frame(USER, 90, "train_loop")
C10D = f"{SITE}/torch/distributed/distributed_c10d.py"
WRAPPER = Frame(f"{SITE}/torch/distributed/c10d_logger.py", 83, "wrapper")
ALL_REDUCE = (Frame(C10D, 3252, "all_reduce"), WRAPPER, Frame(USER, 88, "train_loop"))
BROADCAST = (Frame(C10D, 2900, "broadcast"), WRAPPER, Frame(USER, 80, "train_loop"))
RAY_TRAIN = f"{SITE}/ray/train/v2"
REPORT = (
    Frame(f"{SITE}/ray/_private/worker.py", 2960, "get"),
    Frame(f"{RAY_TRAIN}/_internal/execution/context.py", 470, "report"),
    Frame(f"{RAY_TRAIN}/api/train_fn_utils.py", 70, "report"),
    Frame(USER, 95, "train_loop"),
)
SHARD = (Frame(USER, 71, "load_next_shard"), LOOP)
# DDP: the gradient all_reduce is launched by the C++ reducer inside backward; no frame names it.
BACKWARD = (
    Frame(f"{SITE}/torch/autograd/graph.py", 829, "_engine_run_backward"),
    Frame(f"{SITE}/torch/autograd/__init__.py", 364, "backward"),
    Frame(f"{SITE}/torch/_tensor.py", 630, "backward"),
    Frame(USER, 86, "train_loop"),
)
RECV = (Frame("/usr/lib/python3.11/multiprocessing/connection.py", 395, "_recv"), Frame(USER, 60, "fetch"), LOOP)


def fr(last: int, flying: str | None = None) -> FlightRecord:
    """A recorder whose group enqueued up to ``last``; ``flying``: the op of #last, in flight."""
    done = [Collective(s, "all_reduce", "completed", "0") for s in range(max(1, last - 3), last + (not flying))]
    if flying:
        done.append(Collective(last, flying, "scheduled", "0"))
    return FlightRecord(tuple(done), (PgStatus("0", last, -1, last - 1 if flying else last, "default_pg"),))


def rank(
    r: int,
    frames: tuple[Frame, ...] | None,
    flight: FlightRecord | None = None,
    age: float = 30.0,
    steps: int = 12,
    reports: int = 3,
    phase: Phase = Phase.RUNNING,
) -> RankFacts:
    progress = RankProgress(r, 100 + r, reports, steps, True, age, phase, age, 1.0, 12)
    evidence = None
    if frames is not None:
        stacks = (ThreadStack(1, (Frame(f"{SITE}/x.py", 1, "idle"),), "MainThread"), ThreadStack(7, frames))
        evidence = RankEvidence(r, 100 + r, 7, native=stacks, flight=flight)
    return RankFacts(progress, evidence, node=f"node-{r // 2}", gpus=(str(r % 2),))


CASES: list[tuple[str, list[RankFacts], str, tuple[int, ...], tuple[int, ...]]] = [
    (
        "one rank stopped in a Python function, the others in all_reduce",
        [*(rank(r, ALL_REDUCE, fr(12, "all_reduce")) for r in range(3)), rank(3, SHARD, fr(11), age=312.4)],
        "ranks 0-2 wait in all_reduce #12 (train.py:88); rank 3 never entered it: in load_next_shard (train.py:71), "
        "no progress for 312 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "the same without a flight recorder: no number, and not 'never entered'",
        [*(rank(r, ALL_REDUCE) for r in range(3)), rank(3, SHARD, age=312.4)],
        "ranks 0-2 wait in all_reduce (train.py:88); rank 3 is not in it: in load_next_shard (train.py:71), "
        "no progress for 312 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "every rank in the same collective",
        [rank(r, ALL_REDUCE, fr(12, "all_reduce"), age=40 + r) for r in range(4)],
        "every rank (0-3) waits in all_reduce #12 (train.py:88), no progress for 43 s: none is behind, "
        "the collective itself does not complete",
        (0, 1, 2, 3),
        (),
    ),
    (
        "every rank stopped in the same function",
        [rank(r, SHARD, fr(11)) for r in range(4)],
        "every rank (0-3) is in load_next_shard (train.py:71), no progress for 30 s",
        (0, 1, 2, 3),
        (),
    ),
    (
        "a rank that skipped a report while the others wait in Ray's report barrier",
        [
            *(rank(r, REPORT, fr(12), reports=8, steps=12) for r in range(3)),
            rank(3, ALL_REDUCE, fr(13, "all_reduce"), age=70, reports=8, steps=13),
        ],
        "ranks 0-2 wait in Ray Train's report barrier (train.py:95); rank 3 did not reach it (8 reports, 13 steps): "
        "in all_reduce #13 (train.py:88), no progress for 70 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "no stacks: the beacon's report phase still tells the barrier",
        [rank(0, None, phase=Phase.IN_REPORT), rank(1, None, phase=Phase.IN_REPORT), rank(2, None, reports=2)],
        "ranks 0-1 wait in Ray Train's report barrier; rank 2 did not reach it (2 reports, 12 steps): no stack, "
        "no progress for 30 s",
        (2,),
        (0, 1),
    ),
    (
        "two stopped places, ranks not contiguous, one inside a library call",
        [
            rank(0, ALL_REDUCE, fr(12, "all_reduce")),
            rank(1, SHARD, fr(11), age=50),
            rank(2, ALL_REDUCE, fr(12, "all_reduce")),
            rank(3, RECV, fr(11), age=61),
        ],
        "ranks 0,2 wait in all_reduce #12 (train.py:88); rank 1 never entered it: in load_next_shard (train.py:71), "
        "no progress for 50 s; rank 3 never entered it: in _recv (connection.py:395) called from fetch (train.py:60), "
        "no progress for 61 s",
        (1, 3),
        (0, 2),
    ),
    (
        "a rank in another collective at the same number",
        [*(rank(r, ALL_REDUCE, fr(12, "all_reduce")) for r in range(3)), rank(3, BROADCAST, fr(12, "broadcast"))],
        "ranks 0-2 wait in all_reduce #12 (train.py:88); rank 3 entered another collective at that number: "
        "in broadcast #12 (train.py:80), no progress for 30 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "a rank behind in an earlier collective",
        [*(rank(r, ALL_REDUCE, fr(12, "all_reduce")) for r in (0, 1)), rank(2, ALL_REDUCE, fr(11, "all_reduce"))],
        "ranks 0-1 wait in all_reduce #12 (train.py:88); rank 2 never entered it: in all_reduce #11 (train.py:88), "
        "no progress for 30 s",
        (2,),
        (0, 1),
    ),
    (
        "DDP: the waiters' all_reduce has no frame, the recorder has it in flight",
        [*(rank(r, BACKWARD, fr(40, "all_reduce")) for r in range(3)), rank(3, SHARD, fr(39), age=90)],
        "ranks 0-2 wait in all_reduce #40 (train.py:86); rank 3 never entered it: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "one rank alone",
        [rank(0, SHARD)],
        "rank 0 is in load_next_shard (train.py:71), no progress for 30 s",
        (0,),
        (),
    ),
    (
        "no stack from any rank",
        [rank(0, None), rank(1, None)],
        "every rank (0-1): no stack came back, no progress for 30 s",
        (0, 1),
        (),
    ),
    (
        "nobody waits: two groups elsewhere",
        [rank(0, SHARD), rank(1, SHARD), rank(2, RECV), rank(3, RECV)],
        "no rank waits on another: ranks 0-1 in load_next_shard (train.py:71), no progress for 30 s; "
        "ranks 2-3 in _recv (connection.py:395) called from fetch (train.py:60), no progress for 30 s",
        (0, 1, 2, 3),
        (),
    ),
    (
        "a waiter whose flight recorder came back late waits with the others (its number unknown)",
        [
            rank(0, ALL_REDUCE, fr(12, "all_reduce")),
            rank(1, ALL_REDUCE, None),
            rank(2, ALL_REDUCE, fr(12, "all_reduce")),
            rank(3, SHARD, fr(11), age=40.0),
        ],
        "ranks 0-2 wait in all_reduce #12 (train.py:88); rank 3 never entered it: in load_next_shard (train.py:71), "
        "no progress for 40 s",
        (3,),
        (0, 1, 2),
    ),
]


@pytest.mark.parametrize(("facts", "sentence", "stopped", "waiting"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_verdicts(facts: list[RankFacts], sentence: str, stopped: tuple[int, ...], waiting: tuple[int, ...]) -> None:
    verdict = judge(reversed(facts))  # the order given does not matter
    assert verdict.sentence == sentence
    assert (verdict.stopped, verdict.waiting) == (stopped, waiting)


PAIR_REDUCE = (Frame(C10D, 3252, "all_reduce"), WRAPPER, Frame(USER, 84, "train_loop"))
PAIR_BROADCAST = (Frame(C10D, 2900, "broadcast"), WRAPPER, Frame(USER, 82, "train_loop"))
RECV_FROM_STAGE = (Frame(C10D, 2500, "recv"), WRAPPER, Frame(USER, 60, "train_loop"))
DESCS = {"0": "default_pg", "1": "pair_0_1", "2": "pair_2_3", "3": "mesh_tp"}


def groups(*spec: tuple[str, int, str | None], ranks: dict[str, tuple[int, ...]] | None = None) -> FlightRecord:
    """A recorder of several groups: each (name, last enqueued, the op in flight at that number or
    None), the groups' collectives created in the order given; ``ranks``: each group's ranks, as
    NCCL's ``pg_config`` gives them."""
    collectives, statuses = [], []
    for name, last, flying in spec:
        record = len(collectives)
        for seq in range(max(1, last - 2), last + (flying is None)):
            collectives.append(Collective(seq, "all_reduce", "completed", name, record + seq))
        if flying:
            collectives.append(Collective(last, flying, "scheduled", name, record + 100 + last))
        done = last - 1 if flying else last
        statuses.append(PgStatus(name, last, -1, done, DESCS.get(name, "undefined"), (ranks or {}).get(name, ())))
    return FlightRecord(tuple(collectives), tuple(statuses))


GROUP_CASES: list[tuple[str, list[RankFacts], str, tuple[int, ...], tuple[int, ...]]] = [
    (
        "TP pairs under a default group: rank 3 stopped, its partner waits in the pair, the other pair in the default",
        [
            *(rank(r, ALL_REDUCE, groups(("1", 5, None), ("0", 10, "all_reduce"))) for r in (0, 1)),
            rank(2, PAIR_REDUCE, groups(("0", 9, None), ("2", 13, "all_reduce"))),
            rank(3, SHARD, groups(("0", 9, None), ("2", 12, None)), age=90),
        ],
        "ranks 0-1 wait in all_reduce #10 of default_pg (train.py:88); rank 2 waits in all_reduce #13 of pair_2_3 "
        "(train.py:84); rank 3 never entered all_reduce #13 of pair_2_3: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "the same with the stopped rank's recorder missing (its Python could not run): it is not in the pair's",
        [
            *(rank(r, ALL_REDUCE, groups(("1", 5, None), ("0", 10, "all_reduce"))) for r in (0, 1)),
            rank(2, PAIR_REDUCE, groups(("0", 9, None), ("2", 13, "all_reduce"))),
            rank(3, SHARD, None, age=90),
        ],
        "ranks 0-1 wait in all_reduce #10 of default_pg (train.py:88); rank 2 waits in all_reduce #13 of pair_2_3 "
        "(train.py:84); rank 3 is not in all_reduce #13 of pair_2_3: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "one name for two TP groups (split_group), told apart by NCCL's ranks: the other pair is not behind",
        [
            *(
                rank(r, ALL_REDUCE, groups(("3", 12, None), ("0", 10, "all_reduce"), ranks={"3": (0, 1)}))
                for r in (0, 1)
            ),
            rank(2, PAIR_REDUCE, groups(("0", 9, None), ("3", 13, "all_reduce"), ranks={"3": (2, 3)})),
            rank(3, SHARD, groups(("0", 9, None), ("3", 12, None), ranks={"3": (2, 3)}), age=90),
        ],
        "ranks 0-1 wait in all_reduce #10 of default_pg (train.py:88); rank 2 waits in all_reduce #13 of mesh_tp "
        "(train.py:84); rank 3 never entered all_reduce #13 of mesh_tp: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "one name for two groups without their ranks: a rank behind what the waiter completed there is not in it",
        [
            *(rank(r, ALL_REDUCE, groups(("3", 5, None), ("0", 10, "all_reduce"))) for r in (0, 1)),
            *(rank(r, PAIR_REDUCE, groups(("0", 9, None), ("3", 13, "all_reduce")), age=90) for r in (2, 3)),
        ],
        "ranks 0-1 wait in all_reduce #10 of default_pg (train.py:88); ranks 2-3 never entered it: "
        "in all_reduce #13 of mesh_tp (train.py:84), no progress for 90 s",
        (2, 3),
        (0, 1),
    ),
    (
        "NCCL: a rank waits in its oldest collective not completed, not in the newest it enqueued",
        [
            rank(
                0,
                BACKWARD,
                FlightRecord(
                    (*fr(40, "all_reduce").collectives, Collective(41, "all_reduce", "scheduled", "0", 50)),
                    (PgStatus("0", 41, 40, 39, "default_pg"),),
                ),
            ),
            *(rank(r, BACKWARD, fr(40, "all_reduce")) for r in (1, 2)),
            rank(3, SHARD, fr(39), age=90),
        ],
        "ranks 0-2 wait in all_reduce #40 (train.py:86); rank 3 never entered it: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "Ray's report barrier and a pair: the rank waiting in its pair waits, its stopped partner is named",
        [
            *(rank(r, REPORT, groups(("1", 5, None), ("0", 10, None)), reports=8) for r in (0, 1)),
            rank(2, PAIR_REDUCE, groups(("0", 10, None), ("2", 13, "all_reduce")), reports=7),
            rank(3, SHARD, groups(("0", 10, None), ("2", 12, None)), reports=7, age=90),
        ],
        "ranks 0-1 wait in Ray Train's report barrier (train.py:95); rank 2 waits in all_reduce #13 of pair_2_3 "
        "(train.py:84); rank 3 never entered all_reduce #13 of pair_2_3: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (3,),
        (0, 1, 2),
    ),
    (
        "two groups' collectives issued in different orders: each rank waits on the other",
        [
            rank(0, PAIR_REDUCE, groups(("2", 2, None), ("1", 5, "all_reduce"))),
            rank(1, PAIR_BROADCAST, groups(("1", 4, None), ("2", 3, "broadcast"))),
        ],
        "rank 0 waits in all_reduce #5 of pair_0_1 (train.py:84); rank 1 waits in broadcast #3 of pair_2_3 "
        "(train.py:82), no progress for 30 s: each waits on another rank's collective",
        (0, 1),
        (0, 1),
    ),
    (
        "pipeline stages: a rank in a recv from a stopped stage (a send's number is not the group's)",
        [
            rank(0, SHARD, fr(11), age=90),
            rank(
                1,
                RECV_FROM_STAGE,
                FlightRecord(
                    (*fr(11).collectives, Collective(11, "recv", "scheduled", "0", 20, p2p=True)),
                    (PgStatus("0", 11, -1, 11, "default_pg"),),
                ),
            ),
        ],
        "rank 1 waits in recv (train.py:60); rank 0 is not in it: in load_next_shard (train.py:71), "
        "no progress for 90 s",
        (0,),
        (1,),
    ),
]


@pytest.mark.parametrize(
    ("facts", "sentence", "stopped", "waiting"), [c[1:] for c in GROUP_CASES], ids=[c[0] for c in GROUP_CASES]
)
def test_verdicts_with_several_process_groups(
    facts: list[RankFacts], sentence: str, stopped: tuple[int, ...], waiting: tuple[int, ...]
) -> None:
    """Sequence numbers count per process group: a rank is behind only in a group it is in."""
    verdict = judge(reversed(facts))
    assert verdict.sentence == sentence
    assert (verdict.stopped, verdict.waiting) == (stopped, waiting)


def test_rows_of_the_hangs_table() -> None:
    verdict = judge(CASES[0][1])
    assert verdict.rows[0] == HangRow(
        0, "node-0", "0", 12, 3, 30.0, "waits", "train_loop (train.py:88)", "all_reduce", 12, "default_pg"
    )
    assert verdict.rows[3] == HangRow(
        3, "node-1", "1", 12, 3, 312.4, "stopped", "load_next_shard (train.py:71)", "", None
    )
    assert [r.state for r in judge(CASES[2][1]).rows] == ["stuck"] * 4
    assert judge(CASES[4][1]).rows[0].collective == "report"


def test_ranks_with_the_same_stack_are_shown_once() -> None:
    verdict = judge(CASES[0][1])
    assert [ranks for ranks, _ in verdict.stack_groups] == [(0, 1, 2), (3,)]
    text = format_stack_groups(verdict)
    assert text.startswith("ranks 0-2:\n") and text.count("distributed_c10d.py") == 1
    assert "\n\nrank 3:\n" in text


@pytest.mark.parametrize(
    ("ranks", "text"), [([], ""), ([3], "3"), ([0, 1, 2], "0-2"), ([5, 0, 1, 2, 7, 8, 9, 2], "0-2,5,7-9")]
)
def test_rank_ranges(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


@pytest.mark.parametrize(
    ("file", "library"),
    [
        (USER, False),
        (f"{SITE}/torch/x.py", True),
        ("/usr/lib/python3.11/threading.py", True),
        ("<frozen importlib._bootstrap>", True),
        ("/work/ray_wandb_nodes/_hang/evidence.py", True),
        (f"{SITE}/ray_wandb_nodes/_hang/evidence.py", True),
        (f"{SITE}/ray/train/v2/api/train_fn_utils.py", True),
        (f"{SITE}/transformers/trainer.py", True),
        (f"{SITE}/lightning/pytorch/loops/fit_loop.py", True),
        (f"{SITE}/pytorch_lightning/trainer/trainer.py", True),
        (f"{SITE}/numpy/core/numeric.py", True),
        ("/usr/lib/python3/dist-packages/torch/x.py", True),
        # A training package installed with pip is the user's code: its lines are where it waits.
        (f"{SITE}/torchtitan/train.py", False),
        (f"{SITE}/nemo/collections/llm/gpt/model/base.py", False),
        (f"{SITE}/acme_trainer/loop.py", False),
        (f"{SITE}/acme_single_module.py", False),
        ("/usr/lib/python3/dist-packages/acme_trainer/loop.py", False),
    ],
)
def test_library_frames(file: str, library: bool) -> None:
    assert is_library(file) is library


TITAN = f"{SITE}/torchtitan/train.py"
NEMO = f"{SITE}/nemo/collections/llm/gpt/data/pre_training.py"
LIGHTNING = f"{SITE}/lightning/pytorch/loops"
HF = f"{SITE}/transformers/trainer.py"


@pytest.mark.parametrize(
    ("frames", "where"),
    [
        (  # torchtitan installed with pip: its train step is where the rank waits, not the launcher's call
            (
                Frame(C10D, 3252, "all_reduce"),
                WRAPPER,
                Frame(TITAN, 412, "train_step"),
                Frame(TITAN, 520, "train"),
                Frame(USER, 12, "train_func"),
            ),
            "all_reduce #12 (train.py:412)",
        ),
        (  # NeMo's data module under Lightning's loop: NeMo's frame is the user's, Lightning's is library
            (
                Frame("/usr/lib/python3.11/threading.py", 320, "wait"),
                Frame(NEMO, 88, "next_batch"),
                Frame(f"{LIGHTNING}/fit_loop.py", 455, "advance"),
                Frame(f"{LIGHTNING}/fit_loop.py", 216, "run"),
                Frame(USER, 40, "train_func"),
            ),
            "wait (threading.py:320) called from next_batch (pre_training.py:88)",
        ),
        (  # Hugging Face's Trainer with nothing of the user's below it: the user's call of train()
            (
                Frame(C10D, 3252, "all_reduce"),
                WRAPPER,
                Frame(HF, 2480, "_inner_training_loop"),
                Frame(HF, 2100, "train"),
                Frame(USER, 30, "train_func"),
            ),
            "all_reduce #12 (train.py:30)",
        ),
    ],
    ids=["torchtitan", "nemo-under-lightning", "transformers"],
)
def test_where_is_the_innermost_frame_of_user_code_installed_or_not(frames: tuple[Frame, ...], where: str) -> None:
    flight = fr(12, "all_reduce") if frames[0].file == C10D else fr(11)  # in the collective, or none in flight
    assert _what(position(rank(0, frames, flight))) == where


def test_no_ranks() -> None:
    assert judge([]).sentence == "no ranks to judge"


# Real evidence: line numbers of tests/support/hang_rank.py when the captures were taken.
def test_real_python_stuck_rank() -> None:
    verdict = judge(captured("python", {2: 312.0}))
    assert verdict.sentence == (
        "ranks 0-1 wait in all_reduce #5 (hang_rank.py:63); rank 2 never entered it: "
        "in load_next_shard (hang_rank.py:35), no progress for 312 s"
    )
    assert [(r.rank, r.node, r.gpus, r.collective, r.seq) for r in verdict.rows] == [
        (0, "node-0", "0", "all_reduce", 5),
        (1, "node-0", "1", "all_reduce", 5),
        (2, "node-1", "0", "", None),
    ]


def test_real_native_stuck_rank_from_faulthandler_only() -> None:
    facts = captured("native")
    stuck = next(f for f in facts if f.progress.rank == 2)
    assert stuck.evidence is not None and stuck.evidence.python == () and stuck.evidence.flight is None
    assert position(stuck).kind is Kind.ELSEWHERE
    assert judge(facts).sentence == (
        "ranks 0-1 wait in all_reduce #5 (hang_rank.py:63); rank 2 is not in it: "
        "in read_from_device (hang_rank.py:39), no progress for 30 s"
    )


def test_real_every_rank_in_the_same_function() -> None:
    verdict = judge(captured("all"))
    assert verdict.sentence == "every rank (0-2) is in load_next_shard (hang_rank.py:35), no progress for 30 s"
    assert [ranks for ranks, _ in verdict.stack_groups] == [(0, 1, 2)]


def test_real_several_process_groups_name_only_the_stopped_rank() -> None:
    """Four gloo ranks, in ``pair_0_1`` and ``pair_2_3`` besides the default group, the pairs
    issuing one and three all_reduces a step; rank 3 stopped before its pair's. Its partner waits
    in the pair's #13, ranks 0-1 in the default group's #10: the largest number is not the front,
    and ranks 0-1, in no collective of ``pair_2_3``, are not behind in it (the verdict once said
    "Hang: ranks 0-1,3 stopped", ranks 0-1 having "never entered" #13)."""
    facts = captured("groups", {3: 312.0})
    verdict = judge(facts)
    assert verdict.sentence == (
        "ranks 0-1 wait in all_reduce #10 of default_pg (hang_rank.py:79); rank 2 waits in all_reduce #13 of "
        "pair_2_3 (hang_rank.py:78); rank 3 never entered all_reduce #13 of pair_2_3: in load_next_shard "
        "(hang_rank.py:41), no progress for 312 s"
    )
    assert (verdict.stopped, verdict.waiting) == ((3,), (0, 1, 2))
    assert [(r.rank, r.state, r.collective, r.seq, r.group) for r in verdict.rows] == [
        (0, "waits", "all_reduce", 10, "default_pg"),
        (1, "waits", "all_reduce", 10, "default_pg"),
        (2, "waits", "all_reduce", 13, "pair_2_3"),
        (3, "stopped", "", None, ""),
    ]
    notice = hang_notice(verdict, facts, 1)
    assert notice.title == "Hang: rank 3 stopped" and notice.stopped == (3,)


@pytest.mark.parametrize("missing", [(3,), (2,), (0, 1), (0, 1, 2, 3)], ids=lambda m: f"no-recorder-{m}")
def test_real_several_process_groups_without_some_recorders_still_name_only_the_stopped_rank(
    missing: tuple[int, ...],
) -> None:
    """A recorder that did not come back (the rank's Python could not run, or its dump was late)
    leaves a rank's groups unknown: it never makes a waiting rank stopped."""
    facts = [
        dataclasses.replace(f, evidence=dataclasses.replace(f.evidence, flight=None))
        if f.progress.rank in missing and f.evidence is not None else f
        for f in captured("groups")
    ]  # fmt: skip
    verdict = judge(facts)
    assert (verdict.stopped, verdict.waiting) == ((3,), (0, 1, 2)), verdict.sentence


def test_a_thousand_ranks_are_judged_without_comparing_ranks_facts_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a rank waits is looked up by its number: asking the list of waiters whether it holds
    a rank's facts compared every pair of ranks (8,000 ranks: 18 s of the fleet thread)."""
    facts = many("python", 1000, stuck=517)
    compared = []

    def counting(self: RankFacts, other: object) -> bool:
        compared.append(1)
        return self is other

    monkeypatch.setattr(RankFacts, "__eq__", counting)
    verdict = judge(facts)
    assert compared == []
    assert verdict.sentence == (
        "ranks 0-516,518-999 wait in all_reduce #5 (hang_rank.py:63); rank 517 never entered it: "
        "in load_next_shard (hang_rank.py:35), no progress for 90 s"
    )
    assert (verdict.stopped, verdict.waiting) == ((517,), tuple(r for r in range(1000) if r != 517))
    states = [row.state for row in verdict.rows]
    assert states.count("stopped") == 1 and states[517] == "stopped" and states.count("waits") == 999
    assert [ranks for ranks, _ in verdict.stack_groups] == [tuple(r for r in range(1000) if r != 517), (517,)]


def test_who_holds_up_whom_is_worked_out_once_for_waiters_that_wait_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 ranks in one all_reduce and one stopped: each rank is looked at once as the one that
    may hold the others up, not once for each waiter (a look a pair: 512 ranks took 2.2 s of the
    fleet thread, 8,000 would take minutes)."""
    from ray_wandb_nodes._hang import waits

    looks = []
    holds_up = waits._holds_up

    def counting(*args: object) -> object:
        looks.append(1)
        return holds_up(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(waits, "_holds_up", counting)
    verdict = judge(many("python", 1000, stuck=517))
    assert verdict.stopped == (517,)
    assert len(looks) <= 1000


@pytest.mark.parametrize("mode", ["python", "native", "all"])
def test_the_verdict_and_notice_of_trimmed_recorders_are_those_of_the_full_rings(mode: str) -> None:
    """The node trims each rank's recorder before it crosses (``FlightRecord.trimmed``): what the
    run receives is what the full rings of 2,000 collectives gave."""
    trimmed = many(mode, 12, stuck=7, earlier=1995)
    full = [
        dataclasses.replace(f, evidence=dataclasses.replace(f.evidence, flight=ring))
        if f.evidence is not None and (ring := _ring(mode, f.progress.rank == 7)) else f
        for f in trimmed
    ]  # fmt: skip
    assert sum(len(f.evidence.flight.collectives) for f in full if f.evidence and f.evidence.flight) > 20_000
    now = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=datetime.timezone.utc)
    verdict = judge(trimmed)
    assert verdict == judge(full)
    assert hang_notice(verdict, trimmed, 1, now=now) == hang_notice(judge(full), full, 1, now=now)


@functools.cache
def _ring(mode: str, stuck: bool) -> FlightRecord | None:
    """The captured rank's whole recorder, its ring of 2,000 filled."""
    dump = capture(mode)[2 if stuck else 0]["dump_thread"]
    if not dump or not dump.get("flight_recorder"):
        return None
    return parse_flight_recorder(str(filled_ring(dump, 1995)["flight_recorder"]))
