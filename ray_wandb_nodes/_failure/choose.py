"""The first death (pure): from the table of per-rank failures, which failures are the cause and
which are its consequence.

A failure is a consequence, never a cause of its own, when

- its shape follows another rank's: raised by a collective (where it was raised, not its words:
  ``texts.shape_of``) whose connection to a peer closed or reset, or that timed out waiting for
  its peers; Ray Train's report barrier abandoned (``Shape``);
- it came after the job was already failing: Ray's poll that saw the failure found this rank
  running (``alive_after``);
- it certainly came after a death on the same node: a process that died with no Python acting,
  or a node lost (their windows on that node's monotonic clock do not overlap). A raise is not
  felt by the other ranks until its process ends (a Ray worker stays up after its train function
  raised), so two raises are never ordered so: both are causes.

Every other failure is a cause: failures with no order between them (two ranks failing at
once, on two nodes or within one window) are causes alike, each named. Causes alike are one
cause of several ranks: a node lost with its ranks, or one exception (type, message with its
numbers aside, frame) on several ranks; a rank of a lost node is that loss's, even one Ray's
poll still found running as its node went down. The first cause is the one Ray's controller saw, then
the lowest rank. Where every failure follows another's, no cause was seen: the verdict says so
rather than blame a rank that only waited for the one that died.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .facts import Kind, RankFailure
from .texts import normalized

_WORKER = re.compile(r" in DataLoader worker \d+$")


@dataclass(frozen=True)
class Cause:
    """One cause: a failure, and every rank that failed so."""

    failure: RankFailure  # the lowest rank's
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Verdict:
    """The causes of a failed attempt, the first death first, and their consequences."""

    causes: tuple[Cause, ...]
    consequences: tuple[RankFailure, ...]

    @property
    def first(self) -> Cause | None:
        return self.causes[0] if self.causes else None

    @property
    def cause_seen(self) -> bool:
        return bool(self.causes)


def choose(failures: Sequence[RankFailure]) -> Verdict:
    """The causes and the consequences among ``failures`` (see the module's docstring), in
    O(n log n) of the failures: thousands of ranks fail within a second of each other."""
    own = [f for f in failures if not f.shape.follows and not f.alive_after]
    if not own:  # only failures after Ray's decision: the first of those that are their own
        own = [f for f in failures if not f.shape.follows]
    first = _not_certainly_after(own)
    chosen = {id(f) for f in first}
    lost = {f.node for f in first if f.kind is Kind.LOST}  # a node lost takes all its ranks, whenever seen
    for f in failures:
        if f.kind is Kind.LOST and f.node in lost and id(f) not in chosen:
            first.append(f)
            chosen.add(id(f))
    consequences = sorted((f for f in failures if id(f) not in chosen), key=lambda f: f.rank)
    return Verdict(_grouped(first), tuple(consequences))


def _not_certainly_after(own: Sequence[RankFailure]) -> list[RankFailure]:
    """The failures of ``own`` that no other death of ``own`` certainly came before, in order.

    A death ``g`` came certainly before ``f`` where both are on one node's clock, ``g`` is no
    raise (a raise is not felt until its process ends) and ``g``'s window ends before ``f``'s
    begins. So ``f`` is after some death of its node iff the earliest end of its node's other
    deaths' windows is before ``f``'s beginning: each node's two earliest ends answer every ``f``
    (the earliest, or the second where ``f`` is the earliest itself)."""
    earliest: dict[str, list[tuple[int, int]]] = {}  # node -> its deaths' two earliest (before_ns, id)
    for g in own:
        if _is_raise(g) or g.window is None:
            continue
        ends = earliest.setdefault(g.node, [])
        ends.append((g.window.before_ns, id(g)))
        if len(ends) > 2:
            ends.sort()
            del ends[2:]
    out = []
    for f in own:
        ends = sorted(earliest.get(f.node, ()))
        other = next((end for end, who in ends if who != id(f)), None)
        if f.window is None or other is None or not other < f.window.after_ns:
            out.append(f)
    return out


def _is_raise(f: RankFailure) -> bool:
    """A raise (a DataLoader worker killed for memory too: its rank raised, its process lives on)."""
    return f.kind is Kind.RAISED or bool(f.error_type)


def _key(f: RankFailure) -> tuple[str, ...]:
    if f.kind is Kind.RAISED:  # which DataLoader worker aside too: "ValueError in DataLoader worker N"
        error_type = _WORKER.sub(" in DataLoader worker N", f.error_type)
        return (f.kind.value, error_type, normalized(f.message), f.frame.place if f.frame else "")
    return (f.kind.value, f.node, f.signal, f.ended_by)  # a node lost, or one node's processes ended alike


def _grouped(failures: Sequence[RankFailure]) -> tuple[Cause, ...]:
    groups: dict[tuple[str, ...], list[RankFailure]] = {}
    # The rank the others waited for first (what Ray's poll saw of a collective timeout is its waiters'),
    # then what Ray's controller saw, then the lowest rank.
    for f in sorted(failures, key=lambda f: (f.kind is not Kind.STUCK, not f.by_ray, f.rank)):
        groups.setdefault(_key(f), []).append(f)
    causes = []
    for members in groups.values():
        lowest = min(members, key=lambda f: f.rank)
        nodes = tuple(dict.fromkeys(f.node for f in sorted(members, key=lambda f: f.rank)))
        causes.append(Cause(lowest, tuple(sorted(f.rank for f in members)), nodes))
    return tuple(causes)
