"""Which nodes get a writer (pure functions over plain data).

Nodes are keyed by Ray NodeID, never by IP or hostname: several raylets can share an
IP (the local test cluster does), and a replaced node may reuse an address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .._config.values import NodeSelection
from .._health import NodeEnd
from .._wandb.naming import LABELS
from .cap import node_kind

_T = TypeVar("_T")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    hostname: str
    ip: str
    kind: str = ""  # its hardware shape (see cap.node_kind)
    cpus: float = 0.0
    gpus: float = 0.0
    label: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "label", LABELS.label(self.hostname, self.node_id))


def alive_nodes(
    records: Iterable[Mapping[str, object]], known: Mapping[str, NodeInfo] | None = None
) -> dict[str, NodeInfo]:
    """The alive nodes of a ``ray.nodes()`` listing (dead ones stay listed with Alive false);
    a node in ``known`` (the previous answer) keeps its ``NodeInfo``, so a listing costs little
    past reading it."""
    out: dict[str, NodeInfo] = {}
    known = known or {}
    records = list(records)
    # The whole listing labelled at once: no two alive nodes get one label.
    LABELS.assign(
        (str(rec.get("NodeManagerHostname") or ""), str(rec["NodeID"]))
        for rec in records
        if rec.get("Alive") and str(rec["NodeID"]) not in known
    )
    for rec in records:
        if not rec.get("Alive"):
            continue
        node_id = str(rec["NodeID"])
        seen = known.get(node_id)
        if seen is not None:
            out[node_id] = seen
            continue
        resources = rec.get("Resources")
        out[node_id] = NodeInfo(
            node_id=node_id,
            hostname=str(rec.get("NodeManagerHostname") or ""),
            ip=str(rec.get("NodeManagerAddress") or ""),
            kind=node_kind(resources) if isinstance(resources, Mapping) else "",
            cpus=_amount(resources, "CPU"),
            gpus=_amount(resources, "GPU"),
        )
    return out


# Ray's NodeDeathInfo reasons, by number (ray.nodes()) and by name (the state API).
_ENDS = {
    1: NodeEnd.TERMINATED,
    2: NodeEnd.CRASHED,
    3: NodeEnd.PREEMPTED,
    4: NodeEnd.IDLE,
    "EXPECTED_TERMINATION": NodeEnd.TERMINATED,
    "UNEXPECTED_TERMINATION": NodeEnd.CRASHED,
    "AUTOSCALER_DRAIN_PREEMPTED": NodeEnd.PREEMPTED,
    "AUTOSCALER_DRAIN_IDLE": NodeEnd.IDLE,
}


def ended_nodes(records: Iterable[Mapping[str, object]]) -> dict[str, NodeEnd]:
    """The dead nodes of a ``ray.nodes()`` listing and how Ray says each ended (its
    ``DeathReason``; ``UNKNOWN`` where it gives none)."""
    return {
        str(rec["NodeID"]): _ENDS.get(rec.get("DeathReason"), NodeEnd.UNKNOWN)  # type: ignore[call-overload]
        for rec in records
        if not rec.get("Alive")
    }


def select_nodes(
    selection: NodeSelection,
    worker_nodes: Iterable[str],
    alive: Mapping[str, _T],
    primary_node_id: str | None,
) -> dict[str, _T]:
    """Nodes that need a node writer: the selected alive nodes, less the primary's own node.

    ``selection``: ``WORKERS`` (nodes hosting train workers) or ``CLUSTER`` (every alive node).
    The primary's process already reports its own node, so it never gets a second writer.
    """
    wanted = set(alive) if selection is NodeSelection.CLUSTER else set(worker_nodes) & set(alive)
    wanted.discard(primary_node_id or "")
    return {nid: alive[nid] for nid in sorted(wanted)}


def _amount(resources: object, name: str) -> float:
    value = resources.get(name) if isinstance(resources, Mapping) else None
    return float(value) if isinstance(value, (int, float)) else 0.0


def candidate_nodes(alive: Mapping[str, NodeInfo], *, use_gpu: bool, exclude: str | None) -> list[NodeInfo]:
    """The alive nodes that could host a train worker (GPUs when it uses them, else CPUs),
    less ``exclude`` (the controller's node, which its primary covers)."""
    return [n for n in alive.values() if n.node_id != exclude and (n.gpus > 0 if use_gpu else n.cpus > 0)]


def prestart_nodes(
    alive: Mapping[str, NodeInfo],
    free: Mapping[str, Mapping[str, float]],
    *,
    workers: int,
    per_worker: Mapping[str, float],
    exclude: str | None,
) -> list[NodeInfo]:
    """The nodes to start loggers on ahead of the workers' placement: as many as the job can
    use, never more than its own node count. Each alive node holds as many workers as its
    free resources (``free``: node id -> resource -> amount) fit (its fewest over the
    resources a worker asks, ``per_worker``); Train places its workers in one PACK placement
    group, so the nodes with room for the most workers come first, until they hold
    ``workers``. ``exclude`` (the controller's node, which its primary covers) counts for the
    room it has, and gets no logger."""
    need = {r: float(a) for r, a in per_worker.items() if a and a > 0}
    room: dict[str, int] = {}
    for node_id in alive:
        have = free.get(node_id) or {}
        fits = min((int(float(have.get(r) or 0.0) / a + 1e-9) for r, a in need.items()), default=workers)
        if fits > 0:
            room[node_id] = min(fits, workers)
    chosen, left = [], workers
    for node_id in sorted(room, key=lambda n: (-room[n], n != exclude, n)):
        if left <= 0:
            break
        chosen.append(node_id)
        left -= room[node_id]
    return [alive[n] for n in chosen if n != exclude]
