"""Which nodes get a writer (pure functions over plain data).

Nodes are keyed by Ray NodeID, never by IP or hostname: several raylets can share an
IP (the local test cluster does), and a replaced node may reuse an address.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .._naming import node_label

_T = TypeVar("_T")


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    hostname: str
    ip: str

    @property
    def label(self) -> str:
        return node_label(self.hostname, self.node_id)


def alive_nodes(records: Iterable[Mapping[str, object]]) -> dict[str, NodeInfo]:
    """The alive nodes of a ``ray.nodes()`` listing (dead ones stay listed with Alive false)."""
    out: dict[str, NodeInfo] = {}
    for rec in records:
        if not rec.get("Alive"):
            continue
        node_id = str(rec["NodeID"])
        out[node_id] = NodeInfo(
            node_id=node_id,
            hostname=str(rec.get("NodeManagerHostname") or ""),
            ip=str(rec.get("NodeManagerAddress") or ""),
        )
    return out


def select_nodes(
    selection: str,
    worker_nodes: Iterable[str],
    alive: Mapping[str, _T],
    primary_node_id: str | None,
) -> dict[str, _T]:
    """Nodes that need a node writer: the selected alive nodes, less the primary's own node.

    ``selection`` is ``"workers"`` (nodes hosting train workers) or ``"cluster"`` (every alive
    node). The primary's process already reports its own node, so it never gets a second writer.
    """
    if selection == "cluster":
        wanted = set(alive)
    elif selection == "workers":
        wanted = set(worker_nodes) & set(alive)
    else:
        raise ValueError(f"unknown node selection {selection!r}; expected 'workers' or 'cluster'")
    wanted.discard(primary_node_id or "")
    return {nid: alive[nid] for nid in sorted(wanted)}
