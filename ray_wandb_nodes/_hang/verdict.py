"""The verdict across ranks: who stopped and who waits, in one sentence, and the ``hangs`` table's
rows. A pure function of each rank's progress (counts and ages, see ``beacon.progress_of``) and
where it is (``position``): order comes from collective sequence numbers and step and report
counts, never from two hosts' clocks. Who waits on whom across process groups is ``waits``'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .position import RAY_BARRIERS, Kind, Position, RankFacts, group_label, position
from .stacks import Frame
from .waits import DEFAULT_GROUP, Block, How, Seat, blocks


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
