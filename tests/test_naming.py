"""Node labels and run ids (pure)."""

from __future__ import annotations

import re

import pytest

from ray_wandb_nodes._naming import node_label, train_run_id

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
