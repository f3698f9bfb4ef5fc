"""Node labels and run ids (pure)."""

from __future__ import annotations

import re

import pytest

from ray_wandb_nodes._wandb.naming import node_label, train_run_id

# labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostname", "node_id", "label"),
    [
        ("vm", "c2634912abcdef", "node-vm-c26349"),
        ("gpu-node-7.cluster.local", "fd6f8e1f00", "node-gpu-node-7.cluster.local-fd6f8e"),
        ("weird host/name", "0123456789", "node-weird-host-name-012345"),
        ("", "abcdef1234", "node-host-abcdef"),
        (None, "abcdef1234", "node-host-abcdef"),
    ],
)
def test_node_label_is_readable_and_keyed_by_node_id(hostname: str | None, node_id: str, label: str) -> None:
    assert node_label(hostname, node_id) == label


def test_nodes_sharing_a_hostname_get_distinct_labels() -> None:
    assert node_label("vm", "aaaaaa11") != node_label("vm", "bbbbbb11")


# run ids ---------------------------------------------------------------------------------------


def test_run_id_is_stable_for_the_same_storage_and_name() -> None:
    assert train_run_id("/tmp/results", "exp") == train_run_id("/tmp/results/", "exp")
    assert train_run_id("/tmp/results", "exp").startswith("exp-")


def test_run_id_differs_by_storage_path_and_by_name() -> None:
    ids = {train_run_id("/a", "exp"), train_run_id("/b", "exp"), train_run_id("/a", "exp2")}
    assert len(ids) == 3


def test_run_id_uses_only_characters_wandb_accepts() -> None:
    run_id = train_run_id("s3://bucket/x", "my run/with: odd#chars" * 5)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", run_id)
    assert len(run_id) <= 64


# labels on real clusters: long pod names, many nodes -------------------------------------------
POD = "raycluster-team-llm-pretraining-h100-gpu-group-worker-"


def test_a_long_pod_name_keeps_its_distinguishing_tail() -> None:
    a, b = node_label(POD + "x7k2p", "0a1b2c3d"), node_label(POD + "q9m4z", "9f8e7d6c")
    assert a.endswith("-worker-x7k2p-0a1b2c") and b.endswith("-worker-q9m4z-9f8e7d")
    assert a.startswith("node-raycluster") and len(a) <= len("node-") + 40 + len("-0a1b2c")
    # An FQDN over the budget keeps its host name, not its domain.
    fqdn = "ip-10-0-12-34.us-west-2.compute.internal.example.com"
    assert node_label(fqdn, "0a1b2c3d") == "node-ip-10-0-12-34-0a1b2c"


def listing(prefixes: list[str], host: str = POD + "abcde") -> list[dict[str, object]]:
    return [{"NodeID": p + "0" * (56 - len(p)), "NodeManagerHostname": host, "Alive": True} for p in prefixes]


def test_no_two_alive_nodes_share_a_label_even_when_their_node_ids_begin_alike() -> None:
    import hashlib

    from ray_wandb_nodes._fleet.nodes import alive_nodes

    # 1,024 nodes of one host name, NodeIDs as Ray makes them (random hex), three beginning alike.
    prefixes = [hashlib.sha256(str(i).encode()).hexdigest()[:12] for i in range(1021)]
    prefixes += ["d00d00a1", "d00d00a2", "d00d00b1"]
    nodes = alive_nodes(listing(prefixes))
    labels = [n.label for n in nodes.values()]
    assert len(set(labels)) == len(labels) == 1024
    by_prefix = {n.node_id[:8]: n.label for n in nodes.values()}
    assert by_prefix["d00d00a1"].endswith("-d00d00a1") and by_prefix["d00d00b1"].endswith("-d00d00b")
    # Placements and node-strategy run ids name those nodes as the fleet does: one entry each.
    from ray_wandb_nodes._run.train_run import placement_config
    from ray_wandb_nodes._wandb.strategies import Placement, plan_runs

    placements = [Placement(rank, n.node_id, n.hostname) for rank, n in enumerate(nodes.values())]
    by_node = placement_config(placements)["ray_train"]["ranks_by_node"]
    assert by_node == {n.label: [rank] for rank, n in enumerate(nodes.values())}
    assert len({r.run_id for r in plan_runs("node", placements, "base")}) == 1024


def test_a_node_keeps_its_label_and_a_restart_finds_the_same_ones() -> None:
    from ray_wandb_nodes._wandb.naming import NodeLabels

    host = "gpu-host"
    first, second, third = "beef01" + "1" * 50, "beef01" + "2" * 50, "beef01" + "3" * 50
    labels = NodeLabels()
    alone = labels.label(host, first)
    assert alone == "node-gpu-host-beef01"
    # Another node whose label would be the same joins: it gets a longer one; the first keeps its own.
    assert labels.assign([(host, first), (host, second)]) == {first: alone, second: "node-gpu-host-beef012"}
    assert labels.label(host, first) == alone
    # A restarted run sees the nodes together: the same labels whatever their order, none shared.
    listed = [(host, first), (host, second), (host, third)]
    restarted = NodeLabels().assign(listed)
    assert restarted == NodeLabels().assign(reversed(listed))
    assert len(set(restarted.values())) == 3
