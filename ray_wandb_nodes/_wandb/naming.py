"""Names that must be stable: node labels and run ids (pure functions)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable, Mapping

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# W&B run ids: letters, digits, '-', '_' and '.'; keep them well under the 128-character limit.
_RUN_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


HOST_CHARS = 40  # of a label's hostname part
ID_CHARS = 6  # of a label's NodeID part, unless another node's label would be the same
_HEAD_CHARS = 12  # a long hostname keeps its head and its tail: <head>--<tail>


def host_part(hostname: str | None) -> str:
    """A hostname as a label shows it, at most ``HOST_CHARS`` long, keeping what tells nodes
    apart: an FQDN over the budget keeps its first name; a longer name (a KubeRay pod's
    ``<cluster>-<group>-worker-<suffix>``) keeps its head and its tail, where the suffix is."""
    host = _UNSAFE.sub("-", hostname or "").strip("-.") or "host"
    if len(host) > HOST_CHARS and "." in host:
        host = host.split(".", 1)[0].strip("-") or host
    if len(host) > HOST_CHARS:
        tail = HOST_CHARS - _HEAD_CHARS - 2
        host = f"{host[:_HEAD_CHARS].rstrip('-.')}--{host[-tail:].lstrip('-.')}"
    return host


def node_label(hostname: str | None, node_id: str, id_chars: int = ID_CHARS) -> str:
    """``node-<hostname>-<first 6 of NodeID>``: readable, and unique even where nodes share a
    host, unless two nodes' NodeIDs begin alike: :class:`NodeLabels` then gives them more."""
    return f"node-{host_part(hostname)}-{node_id[:id_chars]}"


class NodeLabels:
    """The labels of every node this process has seen: never two nodes with one label, and a
    node keeps the label it was first given for as long as the process runs.

    A node's label is :func:`node_label` unless that is another node's (a known node's, or a
    node's of the same listing): then it gets more of its NodeID, the fewest characters that
    tell it apart. Nodes that collide in one listing all get longer labels, so the result for
    a set of nodes seen together does not depend on their order: a restarted run that finds
    the same nodes alive gives them the same labels."""

    def __init__(self) -> None:
        self._by_node: dict[tuple[str, str], str] = {}  # (hostname, node id) -> its label
        self._nodes: dict[str, tuple[str, str]] = {}  # label -> its node
        self._lock = threading.Lock()

    def assign(self, nodes: Iterable[tuple[str | None, str]]) -> dict[str, str]:
        """Label each (hostname, node id) of ``nodes`` (the alive nodes, or a placement's); node id -> label."""
        keys = [(hostname or "", node_id) for hostname, node_id in nodes]
        with self._lock:
            new: dict[str, list[tuple[str, str]]] = {}
            for key in dict.fromkeys(keys):
                if key not in self._by_node:
                    new.setdefault(node_label(*key), []).append(key)
            for base, group in new.items():
                clash = len(group) > 1 or base in self._nodes
                for key, label in (_longer(group, self._nodes) if clash else {group[0]: base}).items():
                    self._by_node[key], self._nodes[label] = label, key
            return {key[1]: self._by_node[key] for key in keys}

    def label(self, hostname: str | None, node_id: str) -> str:
        return self.assign([(hostname, node_id)])[node_id]


def _longer(group: list[tuple[str, str]], taken: Mapping[str, object]) -> dict[tuple[str, str], str]:
    """Labels for nodes (hostname, node id) whose :func:`node_label` is the same: each with the
    fewest NodeID characters past ``ID_CHARS`` that tell it from the group's other nodes (one
    more than it shares with its neighbours in sorted order) and no label in ``taken`` has (the
    whole NodeID always has one of its own). Sorting keeps it fast for any group size."""
    ordered = sorted(group, key=lambda key: key[1])
    out: dict[tuple[str, str], str] = {}
    for i, (hostname, node_id) in enumerate(ordered):
        chars = ID_CHARS + 1
        for j in (i - 1, i + 1):
            if 0 <= j < len(ordered):
                chars = max(chars, _shared(node_id, ordered[j][1]) + 1)
        chars = min(chars, len(node_id))
        label = node_label(hostname, node_id, chars)
        while (label in taken or label in out.values()) and chars < len(node_id):
            chars += 1
            label = node_label(hostname, node_id, chars)
        out[(hostname, node_id)] = label
    return out


def _shared(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# The one registry of this process: the fleet, the placements and the primary label through it.
LABELS = NodeLabels()


def train_run_id(storage_path: str, run_name: str) -> str:
    """The W&B run id of a Train run: the same for every restart and auto-resume of that run.

    Ray keeps ``storage_path`` and the run name across restarts (auto-resume goes by name),
    so the id is derived from both: readable prefix from the name, hash of the pair.
    """
    digest = hashlib.sha256(f"{storage_path.rstrip('/')}/{run_name}".encode()).hexdigest()[:12]
    slug = _RUN_ID_SAFE.sub("-", run_name).strip("-")[:40] or "run"
    return f"{slug}-{digest}"
