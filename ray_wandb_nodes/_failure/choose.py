"""The first death (pure): from the table of per-rank failures, which failures are the cause and
which are its consequence.

A failure is a consequence, never a cause of its own, when

- its shape follows another rank's: a collective whose connection to a peer closed or reset, or
  that timed out waiting for its peers; Ray Train's report barrier abandoned (``Shape``);
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

from collections.abc import Sequence
from dataclasses import dataclass

from .facts import Kind, RankFailure
from .texts import normalized


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
    """The causes and the consequences among ``failures`` (see the module's docstring)."""
    own = [f for f in failures if not f.shape.follows and not f.alive_after]
    if not own:  # only failures after Ray's decision: the first of those that are their own
        own = [f for f in failures if not f.shape.follows]
    first = [f for f in own if not any(_certainly_before(g, f) for g in own if g is not f)]
    lost = {f.node for f in first if f.kind is Kind.LOST}  # a node lost takes all its ranks, whenever seen
    first += [f for f in failures if f.kind is Kind.LOST and f.node in lost and all(f is not g for g in first)]
    consequences = sorted((f for f in failures if all(f is not c for c in first)), key=lambda f: f.rank)
    return Verdict(_grouped(first), tuple(consequences))


def _certainly_before(a: RankFailure, b: RankFailure) -> bool:
    """Whether death ``a`` came before ``b`` by facts that need no two hosts' clocks."""
    if a.kind is Kind.RAISED or a.node != b.node or a.window is None or b.window is None:
        return False
    return a.window.before(b.window)


def _key(f: RankFailure) -> tuple[str, ...]:
    if f.kind is Kind.RAISED:
        return (f.kind.value, f.error_type, normalized(f.message), f.frame.place if f.frame else "")
    return (f.kind.value, f.node)  # a node lost, or one node's processes killed at once


def _grouped(failures: Sequence[RankFailure]) -> tuple[Cause, ...]:
    groups: dict[tuple[str, ...], list[RankFailure]] = {}
    for f in sorted(failures, key=lambda f: (not f.by_ray, f.rank)):
        groups.setdefault(_key(f), []).append(f)
    causes = []
    for members in groups.values():
        lowest = min(members, key=lambda f: f.rank)
        nodes = tuple(dict.fromkeys(f.node for f in sorted(members, key=lambda f: f.rank)))
        causes.append(Cause(lowest, tuple(sorted(f.rank for f in members)), nodes))
    return tuple(causes)
