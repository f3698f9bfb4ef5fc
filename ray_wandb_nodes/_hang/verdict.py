"""The verdict across ranks: who stopped and who waits, in one sentence, and the ``hangs`` table's
rows. A pure function of each rank's progress (counts and ages, see ``beacon.progress_of``) and
evidence (stacks, collectives): order comes from collective sequence numbers and step and report
counts, never from two hosts' clocks.

Where a rank is comes from its training thread (the beacon's thread, else Ray Train's
``TrainingThread``): in a torch collective (a frame of ``torch/distributed`` named for one, with the
sequence number from the flight recorder), in Ray Train's report barrier (a frame of ``ray/train``
named ``report``, or the beacon's ``IN_REPORT`` phase), or elsewhere (its innermost frame of user
code, that is outside the standard library, site-packages and this package).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .beacon import Phase, RankProgress
from .evidence import RankEvidence
from .stacks import Frame, ThreadStack, training_thread

COLLECTIVES = frozenset(
    "all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier "
    "broadcast broadcast_object_list gather gather_object reduce reduce_scatter reduce_scatter_tensor "
    "scatter scatter_object_list send recv isend irecv batch_isend_irecv monitored_barrier".split()
)
RAY_BARRIERS = {"report": "Ray Train's report barrier", "barrier": "ray.train.collective.barrier",
                "broadcast_from_rank_zero": "ray.train.collective.broadcast_from_rank_zero"}  # fmt: skip
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "/ray_wandb_nodes/")


class Kind(enum.Enum):
    """Where a rank's training thread is."""

    COLLECTIVE = "collective"  # waits in a torch collective
    RAY_BARRIER = "ray_barrier"  # waits in Ray Train's report (or collective) barrier
    ELSEWHERE = "elsewhere"  # in user code or a library call that is not a wait on the others
    UNKNOWN = "unknown"  # no stack came back


@dataclass(frozen=True)
class RankFacts:
    """What the verdict knows of one rank; ``node`` and ``gpus`` come from the worker group."""

    progress: RankProgress
    evidence: RankEvidence | None = None
    node: str = ""
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Position:
    """Where one rank is."""

    kind: Kind
    where: Frame | None  # the innermost frame of user code (the call site of a wait)
    inner: Frame | None  # the innermost frame of all, where it is not ``where``
    op: str = ""  # the collective or barrier
    seq: int | None = None  # the collective's sequence number
    pg: str = ""
    stack: tuple[Frame, ...] = ()

    def place(self) -> str:
        """``load_next_shard (train.py:71)``; a library frame inside it named first."""
        if self.where is None and self.inner is None:
            return "no stack"
        if self.where is None:
            assert self.inner is not None
            return f"{self.inner.function} ({self.inner.place})"
        own = f"{self.where.function} ({self.where.place})"
        if self.inner is not None and self.kind is Kind.ELSEWHERE:
            return f"{self.inner.function} ({self.inner.place}) called from {own}"
        return own


@dataclass(frozen=True)
class HangRow:
    """One row of the run's ``hangs`` table."""

    rank: int
    node: str
    gpus: str
    last_step: int
    reports: int
    seconds_since_progress: float
    state: str  # "waits", "stopped" or "stuck" (every rank in one place)
    where: str
    collective: str
    seq: int | None


@dataclass(frozen=True)
class Verdict:
    sentence: str
    stopped: tuple[int, ...]
    waiting: tuple[int, ...]
    rows: tuple[HangRow, ...]
    stack_groups: tuple[tuple[tuple[int, ...], tuple[Frame, ...]], ...]  # ranks sharing one training stack


def is_library(file: str) -> bool:
    """Whether ``file`` is the standard library, an installed package, frozen, or this plugin."""
    return file.startswith("<") or any(mark in file for mark in _LIBRARY_MARKS)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-2,5,7-9``."""
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def position(facts: RankFacts) -> Position:
    """Where one rank is, from its training thread's stack and its flight recorder."""
    evidence = facts.evidence
    thread: ThreadStack | None = None
    if evidence is not None:
        thread = training_thread(evidence.stacks, evidence.training_ident)
        if thread is None and len(evidence.stacks) == 1:
            thread = evidence.stacks[0]
    if thread is None or not thread.frames:
        kind = Kind.RAY_BARRIER if facts.progress.phase is Phase.IN_REPORT else Kind.UNKNOWN
        return Position(kind, None, None, "report" if kind is Kind.RAY_BARRIER else "")
    frames = thread.frames
    user_at = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    where = frames[user_at] if user_at is not None else None
    inner = frames[0] if user_at != 0 else None
    outer_lib = frames[: user_at if user_at is not None else len(frames)]
    for frame in reversed(outer_lib):  # the outermost library call names the wait
        if "/torch/distributed/" in frame.file and frame.function in COLLECTIVES:
            seq, pg = _seq_in_flight(evidence, frame.function)
            return Position(Kind.COLLECTIVE, where, None, frame.function, seq, pg, frames)
        if "/ray/train/" in frame.file and frame.function in RAY_BARRIERS:
            return Position(Kind.RAY_BARRIER, where, None, frame.function, None, "", frames)
    if facts.progress.phase is Phase.IN_REPORT:
        return Position(Kind.RAY_BARRIER, where, None, "report", None, "", frames)
    # A collective in flight with no frame named for it: launched from C++ (DDP's reducer inside
    # backward) or async and waited on elsewhere. A rank with one in flight entered it and waits.
    flying = evidence.flight.in_flight() if evidence is not None and evidence.flight is not None else []
    if flying:
        last = max(flying, key=lambda c: c.seq)
        return Position(Kind.COLLECTIVE, where, None, last.op, last.seq, last.pg, frames)
    return Position(Kind.ELSEWHERE, where, inner, "", None, "", frames)


def _seq_in_flight(evidence: RankEvidence | None, op: str) -> tuple[int | None, str]:
    if evidence is None or evidence.flight is None:
        return None, ""
    flying = evidence.flight.in_flight()
    match = [c for c in flying if c.op == op] or flying
    if not match:
        return None, ""
    last = max(match, key=lambda c: c.seq)
    return last.seq, last.pg


def _what(pos: Position) -> str:
    """``all_reduce #12 (train.py:88)`` / ``Ray Train's report barrier (train.py:95)``."""
    if pos.kind is Kind.COLLECTIVE:
        head = pos.op + (f" #{pos.seq}" if pos.seq is not None else "")
    elif pos.kind is Kind.RAY_BARRIER:
        head = RAY_BARRIERS.get(pos.op, "Ray Train's report barrier")
    else:
        return pos.place()
    return head + (f" ({pos.where.place})" if pos.where is not None else "")


def _same_wait(pos: Position, front: Position) -> bool:
    """``pos`` is a wait in ``front``'s collective, its sequence number unknown."""
    return pos.kind is Kind.COLLECTIVE and pos.seq is None and (pos.op, pos.where) == (front.op, front.where)


def _key(pos: Position) -> tuple[object, ...]:
    return (pos.kind, pos.op, pos.seq, pos.where, pos.inner if pos.kind is Kind.ELSEWHERE else None)


def _age(facts: Sequence[RankFacts]) -> str:
    return f"no progress for {max(f.progress.age_s for f in facts):.0f} s"


def judge(ranks: Iterable[RankFacts]) -> Verdict:
    """Who stopped and who waits, across ``ranks`` (every rank of the job, hung or not)."""
    facts = sorted(ranks, key=lambda f: f.progress.rank)
    if not facts:
        return Verdict("no ranks to judge", (), (), (), ())
    positions = {f.progress.rank: position(f) for f in facts}
    groups: dict[tuple[object, ...], list[RankFacts]] = {}
    for f in facts:
        groups.setdefault(_key(positions[f.progress.rank]), []).append(f)
    waiting_kind = next(
        (k for k in (Kind.RAY_BARRIER, Kind.COLLECTIVE) if any(p.kind is k for p in positions.values())), None
    )
    waiters: list[RankFacts] = []
    wait_ranks: set[int] = set()  # by rank: asking a list whether it holds a rank's facts is quadratic
    if len(groups) == 1:
        only = positions[facts[0].progress.rank]
        verb = "waits in" if only.kind in (Kind.COLLECTIVE, Kind.RAY_BARRIER) else "is in"
        every = f"every rank ({rank_ranges(f.progress.rank for f in facts)})"
        if len(facts) == 1:
            every = f"rank {facts[0].progress.rank}"
        if only.kind is Kind.UNKNOWN:
            sentence = f"{every}: no stack came back, {_age(facts)}"
        else:
            sentence = f"{every} {verb} {_what(only)}, {_age(facts)}"
        if only.kind is Kind.COLLECTIVE:
            sentence += ": none is behind, the collective itself does not complete"
        stopped = [f.progress.rank for f in facts]
        state = "stuck"
    else:
        if waiting_kind is Kind.RAY_BARRIER:
            waiters = [f for f in facts if positions[f.progress.rank].kind is Kind.RAY_BARRIER]
        elif waiting_kind is Kind.COLLECTIVE:
            # The front: the furthest collective, and of several at one number the most ranks'.
            waiters = max(
                (g for g in groups.values() if positions[g[0].progress.rank].kind is Kind.COLLECTIVE),
                key=lambda g: (positions[g[0].progress.rank].seq or -1, len(g)),
            )
            # A rank in the same collective at the same line whose flight recorder did not come
            # back (its dump was late) waits there too: nothing says it is behind.
            front = positions[waiters[0].progress.rank]
            wait_ranks = {f.progress.rank for f in waiters}
            waiters = waiters + [
                f for f in facts
                if f.progress.rank not in wait_ranks and _same_wait(positions[f.progress.rank], front)
            ]  # fmt: skip
            waiters.sort(key=lambda f: f.progress.rank)
        wait_ranks = {f.progress.rank for f in waiters}
        others = [f for f in facts if f.progress.rank not in wait_ranks]
        clauses = []
        if waiters:
            head = positions[waiters[0].progress.rank]
            clauses.append(f"{_ranks([f.progress.rank for f in waiters])} wait in {_what(head)}")
        for group in _groups(others, positions):
            pos = positions[group[0].progress.rank]
            clauses.append(
                f"{_ranks([f.progress.rank for f in group])}{_relation(group, pos, waiters, positions)}"
                f"{'in ' if pos.kind is not Kind.UNKNOWN else ''}{_what(pos)}, {_age(group)}"
            )
        sentence = "; ".join(clauses)
        if not waiters:
            sentence = "no rank waits on another: " + sentence
        stopped = [f.progress.rank for f in others]
        state = ""
    rows = tuple(
        _row(f, positions[f.progress.rank], state or ("waits" if f.progress.rank in wait_ranks else "stopped"))
        for f in facts
    )
    return Verdict(
        sentence=sentence,
        stopped=tuple(stopped),
        waiting=tuple(f.progress.rank for f in waiters),
        rows=rows,
        stack_groups=_stack_groups(positions),
    )


def _groups(facts: Sequence[RankFacts], positions: dict[int, Position]) -> list[list[RankFacts]]:
    out: dict[tuple[object, ...], list[RankFacts]] = {}
    for f in facts:
        out.setdefault(_key(positions[f.progress.rank]), []).append(f)
    return list(out.values())


def _relation(
    group: Sequence[RankFacts], pos: Position, waiters: Sequence[RankFacts], positions: dict[int, Position]
) -> str:
    """What a stopped group did not do that the waiters wait for."""
    if not waiters:
        return " "
    front = positions[waiters[0].progress.rank]
    if front.kind is Kind.RAY_BARRIER:
        reports = max(f.progress.reports for f in group)
        return f" did not reach it ({reports} reports, {max(f.progress.steps for f in group)} steps): "
    if front.seq is not None:
        seen = [f.evidence.flight.last_seq(front.pg) for f in group if f.evidence and f.evidence.flight]
        if seen and max(seen) < front.seq:
            return " never entered it: "
        if pos.kind is Kind.COLLECTIVE and pos.seq == front.seq and pos.op != front.op:
            return " entered another collective at that number: "
    return " is not in it: " if len(group) == 1 else " are not in it: "


def _row(facts: RankFacts, pos: Position, state: str) -> HangRow:
    return HangRow(
        rank=facts.progress.rank,
        node=facts.node,
        gpus=",".join(facts.gpus),
        last_step=facts.progress.steps,
        reports=facts.progress.reports,
        seconds_since_progress=round(facts.progress.age_s, 1),
        state=state,
        where=pos.place(),
        collective=pos.op if pos.kind is Kind.COLLECTIVE else ("report" if pos.kind is Kind.RAY_BARRIER else ""),
        seq=pos.seq,
    )


def _stack_groups(positions: dict[int, Position]) -> tuple[tuple[tuple[int, ...], tuple[Frame, ...]], ...]:
    by_stack: dict[tuple[Frame, ...], list[int]] = {}
    for rank, pos in sorted(positions.items()):
        by_stack.setdefault(pos.stack, []).append(rank)
    return tuple((tuple(ranks), stack) for stack, ranks in by_stack.items())


def format_stack_groups(verdict: Verdict) -> str:
    """The training threads' stacks for the run's stack file, each distinct one once with its ranks."""
    parts = []
    for ranks, frames in verdict.stack_groups:
        lines = [f"{_ranks(ranks)}:"] + [f'  File "{f.file}", line {f.line} in {f.function}' for f in frames]
        parts.append("\n".join(lines) if frames else f"{_ranks(ranks)}: no stack")
    return "\n\n".join(parts) + "\n"
