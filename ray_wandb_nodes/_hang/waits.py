"""Who waits on whom, across process groups (pure): for each rank in a collective, the ranks its
collective waits for. The verdict names as stopped only ranks that wait on nobody.

Sequence numbers count per process group: a collective is (group, number), and a rank is behind
in it only if it is in that group. With TP + DP, HSDP or pipeline stages each rank is in several
groups, and the number of a TP group's all_reduce says nothing of a DP group's. A rank's groups
come from its own flight recorder (the groups its collectives and statuses name) and, where the
backend records them (NCCL), from each group's ranks (``pg_config``). Names can repeat across
disjoint groups (torch's ``split_group``): with the ranks known, a group is its name and its
ranks; without, a rank that has not even entered what the waiting rank already completed in a
group of that name is not in that group (a collective completes on a rank only once every rank
of its group entered it).

A rank waits in the collective that is each group's oldest not completed on it
(``FlightRecord.pending``), and a rank ``m`` holds it up where ``m``:

- is in the group and has not entered that number (``NEVER_ENTERED``);
- entered that number with another collective, and fewer ranks did so than the waiting rank's
  (``OTHER_OP``; of two sides, the one with more ranks is the one waiting);
- is in no collective, and its groups are unknown (no flight recorder came back from it) or
  include this one (``NOT_IN``).

A rank in a collective whose number is unknown (its flight recorder did not come back) is held
up by every rank that is in no collective. Ranks in Ray Train's report barrier wait on every rank
outside it, which is the verdict's rule of its own; they hold up no collective here (a rank in
a collective that waits on ranks in the barrier is the one that diverged).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .flight import Collective, FlightRecord

DEFAULT_GROUP = "0"  # torch names the default (world) group "0": every rank is in it


class How(enum.Enum):
    """How a rank holds up a collective that another rank waits in."""

    NEVER_ENTERED = "never_entered"  # in the group, not yet at that number
    OTHER_OP = "other_op"  # at that number with another collective
    NOT_IN = "not_in"  # in no collective, whether it entered is unknown


@dataclass(frozen=True)
class Seat:
    """One rank as the wait graph sees it."""

    rank: int
    in_collective: bool  # its training thread waits in a torch collective
    in_barrier: bool  # it waits in Ray Train's report barrier
    pending: tuple[Collective, ...]  # the collectives it waits in, one a group (``FlightRecord.pending``)
    record: FlightRecord | None  # its flight recorder (None: none came back)
    wait: tuple[object, ...] = ()  # where it waits (op and frame): ranks without numbers compare by it


@dataclass(frozen=True)
class Block:
    """Rank ``rank`` holds up ``waits`` (a rank's collective; ``None``: one of unknown number)."""

    rank: int
    waits: Collective | None
    how: How


def _members(seats: Sequence[Seat]) -> dict[str, list[tuple[int, ...]]]:
    """Each group name's rank sets as the recorders give them (several: a name used twice)."""
    out: dict[str, list[tuple[int, ...]]] = {}
    for seat in seats:
        for group in seat.record.groups if seat.record else ():
            if group.ranks and group.ranks not in out.setdefault(group.pg, []):
                out[group.pg].append(group.ranks)
    return out


def _in_group(seat: Seat, waiter: Seat, pg: str, members: dict[str, list[tuple[int, ...]]]) -> bool | None:
    """Whether ``seat``'s rank is in ``waiter``'s group named ``pg`` (None: unknown)."""
    own = waiter.record.group(pg) if waiter.record else None
    if own is not None and own.ranks:
        return seat.rank in own.ranks
    if pg == DEFAULT_GROUP:
        return True
    known = members.get(pg, [])
    if len(known) == 1:
        return seat.rank in known[0]
    if seat.record is None:
        return None
    if not seat.record.knows(pg):
        return False
    # The name is the waiter's group's only if this rank entered all the waiter completed in it.
    return waiter.record is None or seat.record.last_seq(pg) >= waiter.record.last_completed(pg)


def _majority(seats: Sequence[Seat]) -> dict[tuple[str, int], str]:
    """For each (group, number) that ranks wait in, the collective most of them entered there."""
    ranks_by_op: dict[tuple[str, int], dict[str, int]] = {}
    for seat in seats:
        for c in seat.pending:
            ops = ranks_by_op.setdefault((c.pg, c.seq), {})
            ops[c.op] = ops.get(c.op, 0) + 1
    return {key: max(ops, key=lambda op: ops[op]) for key, ops in ranks_by_op.items()}  # ties: the lowest rank's


def blocks(seats: Iterable[Seat]) -> dict[int, list[Block]]:
    """For each rank in a collective, the ranks that hold it up (none: it waits on nobody).

    Linear in the ranks for a job whose waiters wait alike: who holds up a collective depends on
    the waiter only through the collective, where the waiter waits, its group's ranks and what it
    completed there, so waiters that share those are judged once (8,000 ranks waiting in one
    all_reduce: one pass, not 8,000), and a group whose ranks are known looks at those ranks only."""
    seats = sorted(seats, key=lambda s: s.rank)
    members = _members(seats)
    majority = _majority(seats)
    by_rank = {s.rank: s for s in seats}
    loose = [s for s in seats if not s.in_collective and not s.in_barrier]  # in no collective
    judged: dict[tuple[object, ...], list[tuple[int, How]]] = {}
    out: dict[int, list[Block]] = {}
    for waiter in seats:
        if not waiter.in_collective:
            continue
        found: list[Block] = []
        if not waiter.pending:
            found = [Block(s.rank, None, How.NOT_IN) for s in loose]
        for c in waiter.pending:
            if c.op != majority[(c.pg, c.seq)]:
                continue  # the other side of a mismatch waits on it; this side holds it up
            own = waiter.record.group(c.pg) if waiter.record is not None else None
            ranks = own.ranks if own is not None else ()
            completed = waiter.record.last_completed(c.pg) if waiter.record is not None else None
            key = (c.pg, c.seq, c.op, waiter.wait, ranks, completed)
            held = judged.get(key)
            if held is None:
                candidates = [by_rank[r] for r in ranks if r in by_rank] if ranks else seats
                held = judged[key] = [
                    (seat.rank, how)
                    for seat in candidates
                    if not seat.in_barrier and (how := _holds_up(seat, waiter, c, members)) is not None
                ]
            found.extend(Block(rank, c, how) for rank, how in held if rank != waiter.rank)
        out[waiter.rank] = found
    return out


def _holds_up(seat: Seat, waiter: Seat, c: Collective, members: dict[str, list[tuple[int, ...]]]) -> How | None:
    member = _in_group(seat, waiter, c.pg, members)
    if member is False:
        return None
    if seat.record is not None:  # in the group: what it entered there
        there = next((p for p in seat.pending if p.pg == c.pg and p.seq == c.seq), None)
        if there is not None:
            return How.OTHER_OP if there.op != c.op else None
        return How.NEVER_ENTERED if seat.record.last_seq(c.pg) < c.seq else None
    if seat.in_collective:
        # No recorder came back from it: at the waiter's own wait it is presumed there; in
        # another collective, it is not in this one if it is in the group at all.
        return How.NOT_IN if member and seat.wait != waiter.wait else None
    return How.NOT_IN
