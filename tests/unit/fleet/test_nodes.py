"""Which nodes are alive and which of them get a node writer (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from ray_wandb_nodes._config.values import NodeSelection
from ray_wandb_nodes._fleet.nodes import NodeInfo, alive_nodes, select_nodes

RECORDS: list[dict[str, Any]] = [
    {"NodeID": "head", "Alive": True, "NodeManagerHostname": "h", "NodeManagerAddress": "10.0.0.1"},
    {"NodeID": "w1", "Alive": True, "NodeManagerHostname": "a", "NodeManagerAddress": "10.0.0.2"},
    {"NodeID": "w2", "Alive": True, "NodeManagerHostname": "a", "NodeManagerAddress": "10.0.0.2"},
    {"NodeID": "dead", "Alive": False, "NodeManagerHostname": "d", "NodeManagerAddress": "10.0.0.3"},
    {"NodeID": "idle", "Alive": True, "NodeManagerHostname": "i", "NodeManagerAddress": "10.0.0.4"},
]


def test_alive_nodes_drops_dead_ones_and_keeps_nodes_sharing_an_ip() -> None:
    alive = alive_nodes(RECORDS)
    assert sorted(alive) == ["head", "idle", "w1", "w2"]
    assert alive["w1"] == NodeInfo("w1", "a", "10.0.0.2")


@pytest.mark.parametrize(
    ("selection", "workers", "primary", "expected"),
    [
        ("workers", ["w1", "w2"], "head", ["w1", "w2"]),
        ("workers", ["head", "w1"], "head", ["w1"]),  # the primary covers its own node
        ("workers", ["head", "head"], "head", []),  # one node: no node writer at all
        ("workers", ["w1", "dead"], "head", ["w1"]),  # a dead node gets no writer
        ("cluster", ["w1"], "head", ["idle", "w1", "w2"]),
        ("cluster", [], "w1", ["head", "idle", "w2"]),
    ],
)
def test_select_nodes(selection: str, workers: list[str], primary: str, expected: list[str]) -> None:
    assert list(select_nodes(NodeSelection(selection), workers, alive_nodes(RECORDS), primary)) == expected
