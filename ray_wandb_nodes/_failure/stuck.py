"""The rank the others waited for (pure): behind a collective timeout, the rank whose progress in
that process group stopped first, alive or dead, named as the cause, and the ranks that timed out
waiting for it as its consequence.

When one rank stops in its own code (a lock, a stalled read: alive, in no collective), the others
enter the next collective and wait until the process group's timeout, then fail: gloo raises
("Timed out waiting 15000ms for recv operation"), NCCL's watchdog prints its lines and aborts the
process. Every failure Ray sees is a waiter's; the rank they waited for did not fail at all. Who it
is comes from numbers, never from clocks or words:

- each waiter's position: the sequence number of the collective it waited in, per process group
  (its own record, written as its exception left the train function; or its watchdog's line,
  ``WorkNCCL(SeqNum=N, ...)``, read off its log once it died);
- every other rank's position: its record of Ray's stop (written as Ray Train asks the worker to
  shut down, before it kills it: its groups' numbers and where its training thread stood).

A rank behind the waiters' collective in its group (it never entered that number) is the rank they
waited for. Where hang detection judged the attempt first (a hang raised before the timeout, with
every rank's stacks and collectives), its verdict is the judgement: who stopped, where, and who
waits, as the hang alert said it (:class:`HangView`). Both give one row of kind ``STUCK`` a
stopped rank, which ``choose`` then names the cause, the waiters its consequence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .._hang import RankProgress
from .facts import Kind, RankFailure, Shape, UserFrame
from .node import NodeFacts
from .record import RankRecord, RecordKind
from .table import RankPlace
from .texts import waiting_in_collective

DEFAULT_GROUP = "0"  # torch names the default (world) group "0"
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms")
_NCCL_TIMEOUT = re.compile(r"Timeout\(ms\)=(\d+)")


@dataclass(frozen=True)
class HangView:
    """What the attempt's hang verdict said (a hang raised before the failure): the stopped ranks,
    each one's place, and the waiters' collective."""

    stopped: tuple[int, ...]
    where: Mapping[int, str]  # rank -> "train.py:42 in load_batch"
    steps: Mapping[int, int]  # rank -> its last step
    collective: str = ""  # the waiters' "all_reduce", "" where unknown
    seq: int | None = None
    group: str = ""  # as the hang alert names it ("" for the default group)
    episode: int = 0


@dataclass(frozen=True)
class Waited:
    """The collective the waiters timed out in."""

    waiters: tuple[int, ...]
    op: str  # "all_reduce"; "" where no frame or line says
    seq: int | None  # its number in its group
    group: str  # its group as a sentence names it: "the default group", "group 1"
    timeout_s: float | None

    def collective(self) -> str:
        """``all_reduce #10 of the default group``."""
        what = self.op or "a collective"
        return what + (f" #{self.seq}" if self.seq is not None else "") + f" of {self.group}"

    def sentence(self) -> str:
        """``timed out after 15 s in all_reduce #10 of the default group waiting for it``."""
        after = f" after {self.timeout_s:.0f} s" if self.timeout_s is not None else ""
        return f"timed out{after} in {self.collective()} waiting for it"


def _group_name(pg: str, desc: str = "") -> str:
    if pg == DEFAULT_GROUP or desc == "default_pg":
        return "the default group"
    return desc if desc and desc != "undefined" else f"group {pg}"


def _records(facts: Mapping[str, NodeFacts]) -> dict[int, list[RankRecord]]:
    out: dict[int, list[RankRecord]] = {}
    for node in facts.values():
        for r in node.records:
            out.setdefault(r.rank, []).append(r)
    return out


def _mine(records: Sequence[RankRecord], pid: int | None, kind: RecordKind) -> RankRecord | None:
    found = [r for r in records if r.kind is kind and (pid is None or r.pid == pid)]
    return min(found, key=lambda r: r.mono_ns) if found else None


def _timeout_s(text: str) -> float | None:
    m = _GLOO_TIMEOUT.search(text) or _NCCL_TIMEOUT.search(text)
    return int(m.group(1)) / 1000 if m else None


MISMATCH_SHARE = 4  # a collective mismatch names the ranks in the other collective when they are a quarter or fewer

# Point-to-point work, and work NCCL coalesces (batched sends and receives: a counter of their own).
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "coalesced collectives", "coalesced"})


@dataclass(frozen=True)
class _Position:
    """A waiter's place: the collective it timed out in, by group and number (its op where known)."""

    rank: int
    group: str
    seq: int
    op: str


def _waiter_positions(
    waiters: Sequence[RankFailure], by_rank: Mapping[int, RankPlace], records: Mapping[int, list[RankRecord]]
) -> list[_Position]:
    """Each waiter's position in each of its groups: its own record of the raise (or, where that
    has none, of its stop: a ``finally: dist.destroy_process_group()`` ran before the raise left),
    else what its error or its watchdog's lines name. Point-to-point waits are left out: NCCL
    numbers them on a counter of their own, and gloo's count is not comparable across ranks that
    send and receive unevenly (a pipeline)."""
    out = []
    for f in waiters:
        c = f.collective
        op = c.op if c is not None else ""
        if op.lower() in P2P:
            continue
        place = by_rank.get(f.rank)
        pid = place.pid if place else None
        mine = records.get(f.rank, ())
        raised = _mine(mine, pid, RecordKind.RAISED)
        groups = raised.groups if raised is not None and raised.groups else ()
        if not groups and (stopped := _mine(mine, pid, RecordKind.STOPPED)) is not None:
            groups = stopped.groups
        if c is not None and c.seq is not None:
            out.append(_Position(f.rank, c.group or DEFAULT_GROUP, c.seq, op))
        else:
            out += [_Position(f.rank, pg, seq, op) for pg, seq in groups]
    return out


def waited_for(
    failures: Sequence[RankFailure],
    places: Iterable[RankPlace],
    facts: Mapping[str, NodeFacts] | None = None,
    hang: HangView | None = None,
) -> tuple[list[RankFailure], Waited | None]:
    """``failures`` with the rank(s) the waiters of a collective timeout waited for added as rows
    of kind ``STUCK`` (a row of theirs already there replaced), and the collective they waited
    in; ``failures`` as they are and None where no rank timed out waiting, or no rank is behind."""
    waiters = [f for f in failures if f.shape is Shape.PEER_TIMEOUT]
    if not waiters:
        return list(failures), None
    facts = facts or {}
    by_rank = {p.rank: p for p in places}
    records = _records(facts)
    progress = {p.rank: p for node in facts.values() for p in node.progress}
    own = {f.rank for f in failures if f.kind is Kind.RAISED and not f.shape.follows}
    waiting = {f.rank for f in waiters}
    timeouts = {rank: w.timeout_s for node in facts.values() for rank, _, w in node.last_words if w.timeout_s}
    timeout = next((t for f in waiters if (t := timeouts.get(f.rank) or _timeout_s(f.message))), None)
    positions = _waiter_positions(waiters, by_rank, records)
    at: dict[str, int] = {}
    for p in positions:
        at[p.group] = max(at.get(p.group, 0), p.seq)
    named = {f.collective.group or DEFAULT_GROUP: f.collective.desc for f in waiters if f.collective is not None}
    op = next((p.op for p in positions if p.op and at.get(p.group) == p.seq), "")
    ctx = _Context(by_rank, records, progress, at, timeout)
    if hang is not None and hang.stopped:
        found = _from_hang(failures, hang, waiting, own, ctx)
        if found[1] is not None:
            return found
    stuck: list[RankFailure] = []
    behind_in: tuple[str, int] | None = None
    for rank in sorted(set(by_rank) - waiting - own):
        place = by_rank[rank]
        stopped = _mine(records.get(rank, ()), place.pid, RecordKind.STOPPED)
        if stopped is None:
            continue  # no position read: a death is its own cause (choose), a live rank no claim
        behind = _behind(dict(stopped.groups), at)
        if not behind or waiting_in_collective(stopped.traceback):
            continue  # not behind, or itself waiting in another collective (a pipeline's stage): not the root
        pg, seq, last = behind
        behind_in = behind_in or (pg, seq)
        stuck.append(_stuck_row(place, stopped.frame, stopped.traceback, progress.get(rank),
                                f"never entered #{seq} (its last: #{last})"))  # fmt: skip
    if stuck and behind_in is not None:
        pg, seq = behind_in
        waited = Waited(tuple(sorted(waiting)), op, seq, _group_name(pg, named.get(pg, "")), timeout)
        return _replaced(failures, stuck), waited
    return _mismatch(failures, positions, waiting, named, ctx)


@dataclass(frozen=True)
class _Context:
    by_rank: Mapping[int, RankPlace]
    records: Mapping[int, list[RankRecord]]
    progress: Mapping[int, RankProgress]
    at: Mapping[str, int]  # each group's highest number a waiter waited in
    timeout: float | None


def _behind(mine: Mapping[str, int], at: Mapping[str, int]) -> tuple[str, int, int] | None:
    """(group, the waiters' number, this rank's last) where this rank never entered the waiters'
    collective; the default group first. None where it is not behind in any group it is in."""
    behind = [(pg, seq, mine[pg]) for pg, seq in at.items() if pg in mine and mine[pg] < seq]
    return min(behind, key=lambda b: (b[0] != DEFAULT_GROUP, b[0])) if behind else None


def _mismatch(
    failures: Sequence[RankFailure],
    positions: Sequence[_Position],
    waiting: set[int],
    named: Mapping[str, str],
    ctx: _Context,
) -> tuple[list[RankFailure], Waited | None]:
    """Every rank waits at the same number, but not in the same collective (rank 3 in broadcast
    #10, the others in all_reduce #10): the fewer, in the other collective, are the ones the
    others waited for. Nothing where the ops are unknown or all alike."""
    at_top = [p for p in positions if p.op and ctx.at.get(p.group) == p.seq]
    ops: dict[str, set[int]] = {}
    for p in at_top:
        ops.setdefault(p.op, set()).add(p.rank)
    if len(ops) < 2:
        return list(failures), None
    majority = max(ops, key=lambda o: (len(ops[o]), o))
    others = sorted(r for o, ranks in ops.items() if o != majority for r in ranks)
    if len(others) * MISMATCH_SHARE > len(at_top):
        return list(failures), None  # no clear minority: nothing says which side held the other up
    group, seq = at_top[0].group, at_top[0].seq
    op_of = {p.rank: p.op for p in at_top}
    stuck = []
    for rank in others:
        place = ctx.by_rank.get(rank)
        if place is None:
            continue
        mine = op_of[rank]
        detail = f"entered {mine} #{seq} where the others entered {majority} #{seq} (a collective mismatch)"
        stuck.append(_stuck_row(place, None, "", ctx.progress.get(rank), detail))
    waiters = tuple(sorted(waiting - set(others)))
    waited = Waited(waiters, majority, seq, _group_name(group, named.get(group, "")), ctx.timeout)
    return _replaced(failures, stuck), waited


def _from_hang(
    failures: Sequence[RankFailure], hang: HangView, waiting: set[int], own: set[int], ctx: _Context
) -> tuple[list[RankFailure], Waited | None]:
    """The hang verdict's judgement: its stopped ranks (those that did not raise on their own),
    less any whose record of Ray's stop shows it was not behind the waiters' collective (the hang
    was another episode's); nothing where none is left."""
    stuck = []
    for rank in hang.stopped:
        if rank in own or rank in waiting or rank not in ctx.by_rank:
            continue
        place = ctx.by_rank[rank]
        stopped = _mine(ctx.records.get(rank, ()), place.pid, RecordKind.STOPPED)
        if stopped is not None and stopped.groups and _behind(dict(stopped.groups), ctx.at) is None:
            continue
        frame = stopped.frame if stopped is not None else None
        where = hang.where.get(rank, "")
        parts = [f"hang {hang.episode} found it stopped" if hang.episode else "",
                 f"at {where}" if where and frame is None else ""]  # fmt: skip
        detail = " ".join(p for p in parts if p)
        stack = stopped.traceback if stopped else ""
        stuck.append(_stuck_row(place, frame, stack, ctx.progress.get(rank), detail))
    if not stuck:
        return list(failures), None
    group = _group_name(DEFAULT_GROUP) if not hang.group else hang.group
    waited = Waited(tuple(sorted(waiting)), hang.collective, hang.seq, group, ctx.timeout)
    return _replaced(failures, stuck), waited


def _stuck_row(
    place: RankPlace, frame: UserFrame | None, stack: str, progress: RankProgress | None, detail: str
) -> RankFailure:
    facts = []
    if progress is not None:
        facts.append(f"{progress.steps} steps, {progress.reports} reports")
        facts.append(f"no progress for {progress.age_s:.0f} s as the attempt failed")
    message = "; ".join([d for d in (detail, ", ".join(facts)) if d])
    return RankFailure(place.rank, place.node, place.gpus, Kind.STUCK, Shape.OWN, "", message, frame, stack,
                       by_ray=False)  # fmt: skip


def _replaced(failures: Sequence[RankFailure], stuck: Sequence[RankFailure]) -> list[RankFailure]:
    ranks = {f.rank for f in stuck}
    return sorted([f for f in failures if f.rank not in ranks] + list(stuck), key=lambda f: f.rank)
