"""The table of per-rank failures (pure): what Ray's controller saw on the poll it decided on,
joined with what each node tells of its ranks (their own records, their processes gone, its
cgroup's OOM kills, its last memory sample) and with the nodes that left the cluster.

A rank's own record is the better account of a raise (its full traceback, causes and moment);
Ray's account is the only one of a death it saw; the node's is the only one of a death Ray had
not seen yet when it decided (the cascade reached its poll first). A process that is gone with
no word, that Ray's poll had found running, was stopped by Ray after its decision: not a failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .facts import Kind, OomEvidence, RankFailure, RayPoll, RayRankError, Shape, Window
from .node import Gone, NodeFacts
from .record import RankRecord, RecordKind
from .texts import causes_of, frames_of, innermost_user_frame, ray_death, shape_of


@dataclass(frozen=True)
class RankPlace:
    """Where a rank of the failed attempt ran."""

    rank: int
    node: str  # the node's label
    gpus: tuple[str, ...] = ()
    pid: int | None = None  # its process (records and processes of an earlier attempt are left out)


def rank_failures(
    places: Iterable[RankPlace],
    poll: RayPoll | None = None,
    nodes: Mapping[str, NodeFacts] | None = None,
    lost: Iterable[str] = (),
) -> list[RankFailure]:
    """Every rank's failure, by rank. ``poll``: Ray's poll the controller decided on (None where
    there is no Train controller: a Tune function trial, an offline run); ``nodes``: each node's
    facts by label; ``lost``: the labels of nodes that left the cluster."""
    by_rank = {p.rank: p for p in places}
    errors = {e.rank: e for e in (poll.errors if poll else ())}
    running = frozenset(poll.running if poll else ())
    lost_nodes = frozenset(lost)
    out = []
    for rank in sorted(by_rank.keys() | errors.keys()):
        place = by_rank.get(rank, RankPlace(rank, "?"))
        facts = (nodes or {}).get(place.node)
        failure = _failure(place, errors.get(rank), facts, rank in running, place.node in lost_nodes)
        if failure is not None:
            out.append(failure)
    return out


def _failure(
    place: RankPlace, error: RayRankError | None, facts: NodeFacts | None, was_running: bool, node_lost: bool
) -> RankFailure | None:
    raised = _record(facts, place, RecordKind.RAISED)
    gone = _gone(facts, place)
    base = RankFailure(place.rank, place.node, place.gpus, Kind.RAISED, by_ray=error is not None,
                       alive_after=was_running and error is None)  # fmt: skip
    if raised is not None or (error is not None and not (error.died or error.timed_out)):
        return _raise(base, raised, error)  # the rank's own account first: it raised, whatever followed
    if error is None and not node_lost:
        if gone is None or was_running or _record(facts, place, RecordKind.STOPPED) is not None:
            return None  # alive, or stopped by Ray after its decision
    return _death(base, error, facts, gone, node_lost)


def _raise(base: RankFailure, record: RankRecord | None, error: RayRankError | None) -> RankFailure:
    """A raise, from the rank's own record where it left one, else from Ray's account."""
    if record is not None:
        error_type, message, text = record.error_type, record.message, record.traceback
        frame, causes = record.frame, record.causes
        window: Window | None = Window(record.mono_ns, record.mono_ns)
    else:
        assert error is not None
        error_type, message, text = error.error_type, error.message, error.traceback
        frame, causes, window = innermost_user_frame(frames_of(text)), error.causes or causes_of(text), None
    return RankFailure(
        base.rank, base.node, base.gpus, Kind.RAISED, shape_of(error_type, message, causes), error_type, message,
        frame, text, None, base.by_ray, base.alive_after, window,
    )  # fmt: skip


def _death(
    base: RankFailure, error: RayRankError | None, facts: NodeFacts | None, gone: Gone | None, node_lost: bool
) -> RankFailure:
    """A death without Python: Ray's account where it saw one, the node's evidence, or the node lost."""
    kind, detail, monitor, gb = Kind.SIGNAL, "its node found its process gone, with no exception recorded", "", None
    if error is not None and error.timed_out:
        kind, detail = Kind.UNRESPONSIVE, error.message
    elif error is not None:
        death = ray_death(error.error_type, error.message, error.preempted)
        kind, detail, monitor, gb = death.kind, death.detail, death.memory, death.process_gb
    if node_lost and kind is not Kind.LOST:  # Ray's own words where it said so (node died, preempted)
        kind, detail = Kind.LOST, "its node left the cluster"
    oom = None
    if kind in (Kind.SIGNAL, Kind.OOM):
        kills = facts.oom_kills if facts is not None else None
        memory = facts.memory_percent if facts is not None else None
        oom = OomEvidence(monitor, gb, kills, gone.oom_kills if gone is not None else None, memory)
        kind = Kind.OOM if oom.found else kind
    window = Window(gone.alive_ns, gone.gone_ns) if gone is not None else None
    text = error.message if error is not None else ""
    return RankFailure(
        base.rank, base.node, base.gpus, kind, Shape.OWN, "", detail, None, text, oom, base.by_ray, base.alive_after,
        window,
    )  # fmt: skip


def _record(facts: NodeFacts | None, place: RankPlace, kind: RecordKind) -> RankRecord | None:
    if facts is None:
        return None
    mine = [r for r in facts.records if r.rank == place.rank and r.kind is kind
            and (place.pid is None or r.pid == place.pid)]  # fmt: skip
    return min(mine, key=lambda r: r.mono_ns) if mine else None


def _gone(facts: NodeFacts | None, place: RankPlace) -> Gone | None:
    if facts is None:
        return None
    mine = [g for g in facts.gone if g.rank == place.rank and (place.pid is None or g.pid == place.pid)]
    return mine[0] if mine else None
