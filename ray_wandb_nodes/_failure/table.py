"""The table of per-rank failures (pure): what Ray's controller saw on the poll it decided on,
joined with what each node tells of its ranks (their own records, their processes gone, its
cgroup's OOM kills, its last memory sample) and with the nodes that left the cluster.

A rank's own record is the better account of a raise (its full traceback, causes and moment);
Ray's account is the only one of a death it saw; the node's is the only one of a death Ray had
not seen yet when it decided (the cascade reached its poll first). A process that is gone with
no word, that Ray's poll had found running, was stopped by Ray after its decision: not a failure.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .dataloader import worker_failure
from .facts import CollectiveAt, Kind, OomEvidence, RankFailure, RayPoll, RayRankError, Shape, UserFrame, Window
from .last_words import LastWords
from .node import Gone, NodeFacts
from .record import RankRecord, RecordKind
from .texts import causes_of, collective_of, frames_of, innermost_user_frame, ray_death, shape_of


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
    cut = _ByRank(nodes or {})
    out = []
    for rank in sorted(by_rank.keys() | errors.keys()):
        place = by_rank.get(rank, RankPlace(rank, "?"))
        facts = cut.facts(place.node, rank)
        failure = _failure(place, errors.get(rank), facts, rank in running, place.node in lost_nodes)
        if failure is not None:
            out.append(failure)
    return out


class _ByRank:
    """Each node's facts cut to one rank's (its records, its processes gone), each node's indexed
    once: a rank's look is then at its own, not at its node's every rank (O(n) in all, not O(n^2)
    where thousands of ranks share a node's facts)."""

    def __init__(self, nodes: Mapping[str, NodeFacts]) -> None:
        self._nodes = nodes
        self._index: dict[str, tuple[dict[int, list[RankRecord]], dict[int, list[Gone]]]] = {}

    def facts(self, node: str, rank: int) -> NodeFacts | None:
        whole = self._nodes.get(node)
        if whole is None:
            return None
        index = self._index.get(node)
        if index is None:
            records: dict[int, list[RankRecord]] = {}
            gone: dict[int, list[Gone]] = {}
            for r in whole.records:
                records.setdefault(r.rank, []).append(r)
            for g in whole.gone:
                gone.setdefault(g.rank, []).append(g)
            index = self._index[node] = (records, gone)
        return replace(whole, records=tuple(index[0].get(rank, ())), gone=tuple(index[1].get(rank, ())))


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
    """A raise, from the rank's own record where it left one, else from Ray's account. Whether it
    follows a peer is judged by where it was raised (the traceback's frames, ``texts.shape_of``); a
    DataLoader worker's failure is named as the worker's (``dataloader``)."""
    if record is not None:
        error_type, message, text = record.error_type, record.message, record.traceback
        frame, causes = record.frame, record.causes
        window: Window | None = Window(record.mono_ns, record.mono_ns)
    else:
        assert error is not None
        error_type, message, text = error.error_type, error.message, error.traceback
        frame, causes, window = innermost_user_frame(frames_of(text)), error.causes or causes_of(text), None
    kind, shape, error_type, message, found, collective = _judged(error_type, message, causes, text)
    return RankFailure(
        base.rank, base.node, base.gpus, kind, shape, error_type, message, found or frame, text, None, base.by_ray,
        base.alive_after, window, collective,
    )  # fmt: skip


@functools.lru_cache(maxsize=16)  # ranks that failed alike (one config error on 8,000 ranks) are read once
def _judged(
    error_type: str, message: str, causes: tuple[str, ...], text: str
) -> tuple[Kind, Shape, str, str, UserFrame | None, CollectiveAt | None]:
    """A raise's kind, shape, type, message and frame (a DataLoader worker's where it was one), and the
    collective it names."""
    kind, shape, frame = Kind.RAISED, shape_of(error_type, message, causes, text), None
    worker = worker_failure(error_type, message, text, causes) if shape is Shape.OWN else None
    if worker is not None:
        kind, error_type, message, frame = worker.kind, worker.error_type, worker.message, worker.frame
    return kind, shape, error_type, message, frame, collective_of(message, text)


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
    words = _last_words(facts, gone)
    if kind in (Kind.SIGNAL, Kind.OOM):
        oom = _memory(facts, gone, monitor, gb)
        # A process whose last words name its end (an abort, a crash) was not the one the OOM
        # killer took, even where its cgroup counted a kill as it died (a peer's, in one container).
        kind = Kind.OOM if oom.found and not (words.signal and not monitor) else kind
    elif kind is Kind.LOST and facts is not None and facts.memory_percent is not None:
        oom = OomEvidence(memory_percent=facts.memory_percent)  # its last sample: a pod-level OOM?
    window = Window(gone.alive_ns, gone.gone_ns) if gone is not None else None
    text = error.message if error is not None else ""
    shape, signal, by = Shape.OWN, words.signal, words.by
    if words.watchdog is not None:  # it waited out a collective, and NCCL's watchdog took it down
        w = words.watchdog
        shape = Shape.PEER_TIMEOUT
        detail = (
            f"NCCL's watchdog timed out {w.op or 'a collective'} #{w.seq} of process group {w.group} and aborted it"
        )
    elif words.peer_lost:  # NCCL lost a peer (a remote error), and its watchdog took this process down
        shape = Shape.PEER_CLOSED
        detail = "NCCL lost a peer (a remote process exited or its connection failed) and aborted the process"
    elif words.found:
        detail = f"{detail}; its log: {words.lines[-1]}" if words.lines else detail
    if words.lines:
        text = "\n".join((text, "Its last words (the worker's log):", *words.lines)).strip()
    return RankFailure(
        base.rank, base.node, base.gpus, kind, shape, "", detail, None, text, oom, base.by_ray, base.alive_after,
        window, words.watchdog, signal, by,
    )  # fmt: skip


def _last_words(facts: NodeFacts | None, gone: Gone | None) -> LastWords:
    """What the dead process's log said of its end, where its node read it."""
    if facts is None or gone is None:
        return LastWords()
    return next((w for rank, pid, w in facts.last_words if (rank, pid) == (gone.rank, gone.pid)), LastWords())


def _memory(facts: NodeFacts | None, gone: Gone | None, monitor: str, gb: float | None) -> OomEvidence:
    """What the node tells of a death's memory: its cgroup's OOM kills (its own cgroup's as it
    died, else the node's), the cgroup's limit and peak, the rank's last size, and which rank of
    the node grew most (Ray's memory monitor kills the newest worker, not the largest)."""
    kills = facts.oom_kills if facts is not None else None
    memory = facts.memory_percent if facts is not None else None
    cgroup = gone.cgroup if gone is not None else None
    grew = None
    if facts is not None and facts.ranks_memory:
        top = max(facts.ranks_memory, key=lambda m: (m.peak - m.first, m.peak))
        grew = (top.rank, top.first, top.peak)
    return OomEvidence(
        monitor, gb, kills, gone.oom_kills if gone is not None else None, memory, cgroup is not None,
        cgroup.limit if cgroup else None, cgroup.peak if cgroup else None, gone.rss if gone else None, grew,
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
