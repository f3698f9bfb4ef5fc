"""The verdict across ranks: who stopped and who waits, in one sentence, and the ``hangs`` table's
rows. A pure function of each rank's progress (counts and ages, see ``beacon.progress_of``) and
evidence (stacks, collectives): order comes from collective sequence numbers and step and report
counts, never from two hosts' clocks.

Where a rank is comes from its training thread (the beacon's thread, else Ray Train's
``TrainingThread``): in a torch collective (a frame of ``torch/distributed`` named for one, with the
sequence number from the flight recorder), in Ray Train's report barrier (a frame of ``ray/train``
named ``report``, or the beacon's ``IN_REPORT`` phase), or elsewhere (its innermost frame of user
code, see :func:`is_library`). Who waits on whom across process groups is ``waits``'.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .beacon import Phase, RankProgress
from .evidence import RankEvidence
from .flight import Collective
from .stacks import Frame, ThreadStack, training_thread
from .waits import DEFAULT_GROUP, Block, How, Seat, blocks

COLLECTIVES = frozenset(
    "all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier "
    "broadcast broadcast_object_list gather gather_object reduce reduce_scatter reduce_scatter_tensor "
    "scatter scatter_object_list send recv isend irecv batch_isend_irecv monitored_barrier".split()
)
RAY_BARRIERS = {"report": "Ray Train's report barrier", "barrier": "ray.train.collective.barrier",
                "broadcast_from_rank_zero": "ray.train.collective.broadcast_from_rank_zero"}  # fmt: skip
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# Installed packages whose frames are library for the "where" of a rank: torch and its own
# packages, Ray, this plugin, and the frameworks' step loop machinery (the trainer that calls the
# user's code and the engines it drives), with the numeric and logging libraries every job calls.
# A user's code is what it would change: a training package installed with pip (torchtitan,
# NeMo, Megatron, an in-house one) is user code, and so is any package not named here. Where in
# doubt, user code: a library frame taken for the user's shows its own true file and line, but a
# user's frame taken for a library's hides the place the user must look at.
LIBRARY_PACKAGES = frozenset(
    "torch torchvision torchaudio torchdata functorch triton ray ray_wandb_nodes transformers accelerate "
    "deepspeed lightning pytorch_lightning lightning_fabric numpy wandb".split()
)
_INSTALLED = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_STDLIB = re.compile(r"/lib/python3(?:\.\d+)?/")


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
    seq: int | None = None  # the collective's sequence number in its process group
    pg: str = ""  # the collective's process group (its name)
    stack: tuple[Frame, ...] = ()
    group: str = ""  # the process group as the sentence names it (``default_pg``, ``mesh_tp``, ``group 3``)
    pending: tuple[Collective, ...] = ()  # every collective it waits in, one a group (``FlightRecord.pending``)

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
    state: str  # "waits", "stopped" or "stuck" (every rank in one place, or waiting on each other)
    where: str
    collective: str
    seq: int | None  # in the collective's process group
    group: str = ""  # the collective's process group, as the sentence names it


@dataclass(frozen=True)
class Verdict:
    sentence: str
    stopped: tuple[int, ...]
    waiting: tuple[int, ...]
    rows: tuple[HangRow, ...]
    stack_groups: tuple[tuple[tuple[int, ...], tuple[Frame, ...]], ...]  # ranks sharing one training stack


def is_library(file: str) -> bool:
    """Whether ``file`` is library code for a rank's "where": frozen, the standard library, this
    plugin, or an installed package of :data:`LIBRARY_PACKAGES`; any other installed package is
    user code."""
    if file.startswith("<"):
        return True
    installed = _INSTALLED.search(file)
    if installed is not None:
        top = installed.group(1)
        return (top[:-3] if top.endswith(".py") else top) in LIBRARY_PACKAGES
    return bool(_STDLIB.search(file)) or "/ray_wandb_nodes/" in file


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


def _wait(ranks: Sequence[int]) -> str:
    return f"{_ranks(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in "


def group_label(pg: str, desc: str) -> str:
    """A process group as the sentence names it: torch's description where it has one that
    says something (``default_pg``, ``mesh_tp``, the user's ``group_desc``), else ``group <name>``."""
    return desc if desc and desc != "undefined" else f"group {pg}"


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
    record = evidence.flight if evidence is not None else None
    pending = tuple(record.pending()) if record is not None else ()
    for frame in reversed(outer_lib):  # the outermost library call names the wait
        if "/torch/distributed/" in frame.file and frame.function in COLLECTIVES:
            if frame.function in P2P:  # a send or recv: its number is not the group's
                return Position(Kind.COLLECTIVE, where, None, frame.function, stack=frames)
            # The collective it waits in: of each group's oldest not completed, the one the frame
            # names (a barrier is recorded as an all_reduce: else the oldest of all).
            now = next((c for c in pending if c.op == frame.function), pending[0] if pending else None)
            return _in_collective(facts, where, frame.function, now, frames, pending)
        if "/ray/train/" in frame.file and frame.function in RAY_BARRIERS:
            return Position(Kind.RAY_BARRIER, where, None, frame.function, stack=frames)
    if facts.progress.phase is Phase.IN_REPORT:
        return Position(Kind.RAY_BARRIER, where, None, "report", stack=frames)
    # A collective in flight with no frame named for it: launched from C++ (DDP's reducer inside
    # backward) or async and waited on elsewhere. A rank with one in flight entered it and waits.
    if pending:
        return _in_collective(facts, where, pending[0].op, pending[0], frames, pending)
    p2p = [c for c in record.in_flight() if c.p2p] if record is not None else []
    if p2p:
        return Position(Kind.COLLECTIVE, where, None, p2p[0].op, stack=frames)
    return Position(Kind.ELSEWHERE, where, inner, stack=frames)


def _in_collective(
    facts: RankFacts,
    where: Frame | None,
    op: str,
    now: Collective | None,
    frames: tuple[Frame, ...],
    pending: tuple[Collective, ...],
) -> Position:
    if now is None:
        return Position(Kind.COLLECTIVE, where, None, op, stack=frames)
    record = facts.evidence.flight if facts.evidence is not None else None
    status = record.group(now.pg) if record is not None else None
    label = group_label(now.pg, status.desc if status is not None else "")
    return Position(Kind.COLLECTIVE, where, None, op, now.seq, now.pg, frames, label, pending)


def _what(pos: Position, groups: bool = False) -> str:
    """``all_reduce #12 (train.py:88)`` / ``Ray Train's report barrier (train.py:95)``; with
    ``groups``, the collective's process group too (``all_reduce #12 of mesh_tp (...)``)."""
    if pos.kind is Kind.COLLECTIVE:
        head = pos.op + (f" #{pos.seq}" if pos.seq is not None else "")
        head += f" of {pos.group}" if groups and pos.group else ""
    elif pos.kind is Kind.RAY_BARRIER:
        head = RAY_BARRIERS.get(pos.op, "Ray Train's report barrier")
    else:
        return pos.place()
    return head + (f" ({pos.where.place})" if pos.where is not None else "")


def _key(pos: Position) -> tuple[object, ...]:
    return (pos.kind, pos.op, pos.pg, pos.seq, pos.where, pos.inner if pos.kind is Kind.ELSEWHERE else None)


def _age(facts: Sequence[RankFacts]) -> str:
    return f"no progress for {max(f.progress.age_s for f in facts):.0f} s"


def judge(ranks: Iterable[RankFacts]) -> Verdict:
    """Who stopped and who waits, across ``ranks`` (every rank of the job, hung or not).

    The ranks in Ray Train's report barrier wait; so does a rank in a collective that another
    rank holds up (``waits.blocks``: in its process group and not yet at its number, or in no
    collective). The others stopped, and the sentence says what each holds up."""
    facts = sorted(ranks, key=lambda f: f.progress.rank)
    if not facts:
        return Verdict("no ranks to judge", (), (), (), ())
    positions = {f.progress.rank: position(f) for f in facts}
    places = _places(facts, positions)
    if len(places) == 1:
        return _one_place(facts, positions)
    held = blocks(_seat(f, positions[f.progress.rank]) for f in facts)
    wait_ranks = {r for r, p in positions.items() if p.kind is Kind.RAY_BARRIER} | {r for r, b in held.items() if b}
    waiters = [f for f in facts if f.progress.rank in wait_ranks]
    others = [f for f in facts if f.progress.rank not in wait_ranks]
    groups = any(p.pg not in ("", DEFAULT_GROUP) for p in positions.values())
    waiting_places = _waiting_places(waiters, positions)
    clauses = [f"{_wait(ranks)}{_what(positions[ranks[0]], groups)}" for ranks in waiting_places]
    state = {r: "waits" for r in wait_ranks}
    if waiters and not others:
        # Every rank waits on another: each group's collectives were issued in a different order.
        sentence = "; ".join(clauses) + f", {_age(facts)}: each waits on another rank's collective"
        stopped = [f.progress.rank for f in waiters if positions[f.progress.rank].kind is Kind.COLLECTIVE]
        state.update(dict.fromkeys(stopped, "stuck"))
    else:
        head = positions[waiting_places[0][0]] if len(waiting_places) == 1 else None
        for group in _places(others, positions).values():
            pos = positions[group[0].progress.rank]
            relation = _relation(group, pos, head, held, positions, groups)
            clauses.append(
                f"{_ranks([f.progress.rank for f in group])}{relation}"
                f"{'in ' if pos.kind is not Kind.UNKNOWN else ''}{_what(pos, groups)}, {_age(group)}"
            )
        sentence = "; ".join(clauses)
        if not waiters:
            sentence = "no rank waits on another: " + sentence
        stopped = [f.progress.rank for f in others]
    return Verdict(
        sentence=sentence,
        stopped=tuple(stopped),
        waiting=tuple(f.progress.rank for f in waiters),
        rows=tuple(_row(f, positions[f.progress.rank], state.get(f.progress.rank, "stopped"), groups) for f in facts),
        stack_groups=_stack_groups(positions),
    )


def _one_place(facts: Sequence[RankFacts], positions: dict[int, Position]) -> Verdict:
    """Every rank in one place: none is behind another."""
    only = positions[facts[0].progress.rank]
    verb = "waits in" if only.kind in (Kind.COLLECTIVE, Kind.RAY_BARRIER) else "is in"
    every = f"every rank ({rank_ranges(f.progress.rank for f in facts)})"
    if len(facts) == 1:
        every = f"rank {facts[0].progress.rank}"
    groups = only.pg not in ("", DEFAULT_GROUP)
    if only.kind is Kind.UNKNOWN:
        sentence = f"{every}: no stack came back, {_age(facts)}"
    else:
        sentence = f"{every} {verb} {_what(only, groups)}, {_age(facts)}"
    if only.kind is Kind.COLLECTIVE:
        sentence += ": none is behind, the collective itself does not complete"
    return Verdict(
        sentence=sentence,
        stopped=tuple(f.progress.rank for f in facts),
        waiting=(),
        rows=tuple(_row(f, positions[f.progress.rank], "stuck", groups) for f in facts),
        stack_groups=_stack_groups(positions),
    )


def _seat(facts: RankFacts, pos: Position) -> Seat:
    return Seat(
        rank=facts.progress.rank,
        in_collective=pos.kind is Kind.COLLECTIVE,
        in_barrier=pos.kind is Kind.RAY_BARRIER,
        pending=pos.pending,
        record=facts.evidence.flight if facts.evidence is not None else None,
        wait=(pos.op, pos.where),
    )


def _places(facts: Sequence[RankFacts], positions: dict[int, Position]) -> dict[tuple[object, ...], list[RankFacts]]:
    out: dict[tuple[object, ...], list[RankFacts]] = {}
    for f in facts:
        out.setdefault(_key(positions[f.progress.rank]), []).append(f)
    return out


def _waiting_places(waiters: Sequence[RankFacts], positions: dict[int, Position]) -> list[list[int]]:
    """The waiters' ranks by place, a place's lowest rank first. A waiter in a collective whose
    number is unknown (its flight recorder did not come back) joins the biggest place in the same
    collective at the same line: nothing says it is elsewhere."""
    places: dict[tuple[object, ...], list[int]] = {}
    for f in waiters:
        places.setdefault(_key(positions[f.progress.rank]), []).append(f.progress.rank)
    for key, ranks in list(places.items()):
        pos = positions[ranks[0]]
        if pos.kind is not Kind.COLLECTIVE or pos.seq is not None:
            continue
        same = [k for k in places if k != key and positions[places[k][0]].seq is not None and k[1] == key[1]
                and k[4] == key[4]]  # fmt: skip
        if same:
            biggest = max(same, key=lambda k: len(places[k]))
            places[biggest] = sorted(places[biggest] + places.pop(key))
    return sorted(places.values())


def _relation(
    group: Sequence[RankFacts],
    pos: Position,
    head: Position | None,
    held: dict[int, list[Block]],
    positions: dict[int, Position],
    groups: bool,
) -> str:
    """What a stopped group holds up. ``head`` is the waiters' one place, which the sentence then
    calls "it" (None: several places, and the collective it holds up most directly is named)."""
    ranks = {f.progress.rank for f in group}
    mine = [(w, b) for w, found in held.items() for b in found if b.rank in ranks]
    if not mine:
        if any(p.kind is Kind.RAY_BARRIER for p in positions.values()):
            reports, steps = max(f.progress.reports for f in group), max(f.progress.steps for f in group)
            barrier = "it" if head is not None else "Ray Train's report barrier"
            return f" did not reach {barrier} ({reports} reports, {steps} steps): "
        if head is not None:
            return " is not in it: " if len(group) == 1 else " are not in it: "
        return " "
    # The wait it holds up with the fewest others: the one that waits on it most directly.
    waiter, block = min(mine, key=lambda wb: (sum(b.waits == wb[1].waits for b in held[wb[0]]), wb[0]))
    hows = {b.how for w, b in mine if w == waiter and b.waits == block.waits}
    c = block.waits
    if head is not None and (c is None or (c.pg, c.seq) == (head.pg, head.seq)):
        it = "it"
    elif c is None:
        it = _what(positions[waiter], groups)
    else:
        label = next((p.group for p in positions.values() if p.pg == c.pg and p.group), group_label(c.pg, ""))
        it = f"{c.op} #{c.seq}" + (f" of {label}" if groups else "")
    if hows == {How.NEVER_ENTERED}:
        return f" never entered {it}: "
    if hows == {How.OTHER_OP}:
        return f" entered another collective at {'that number' if it == 'it' else it}: "
    return f" {'is' if len(group) == 1 else 'are'} not in {it}: "


def _row(facts: RankFacts, pos: Position, state: str, groups: bool) -> HangRow:
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
        group=pos.group,
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
