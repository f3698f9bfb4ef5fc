"""A node writer's packed offline run crosses from its node to the driver side as one typed value
(``PackedRun``): the node's logger packs it, and the fleet's collection reads that value to bring
it over, leave it on the node, or name it empty. Ray's calls are answered at once here; the
collection through real Ray is proved in ``tests/e2e/test_train_multinode.py -k offline``."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ray_wandb_nodes._fleet import collect as _collect
from ray_wandb_nodes._fleet.collect import CollectJob, OfflineCollection
from ray_wandb_nodes._fleet.node_offline import OfflineRuns, PackedRun
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.pool import LoggerHandle
from ray_wandb_nodes._wandb.writers import Role
from ray_wandb_nodes._warn import Warner
from ray_wandb_nodes.offline.index import node_local_dir, open_index

NODE = NodeInfo("n1", "host-1", "10.0.0.1")


class NodeRuns(OfflineRuns):
    """A node logger's offline-run calls, hosting no writer (its run finished)."""

    def hosts(self, key: str) -> bool:
        return False


class Remote:
    """An actor handle's ``actor.call.remote(...)``, answered at once (no Ray)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=getattr(self._obj, name))


@pytest.fixture(autouse=True)
def node_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The node's temp folder (where its writers' offline runs are), and Ray's get answered at once."""
    import ray

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-tmp"))
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)
    return tmp_path


def node_run(run_id: str, size: int) -> None:
    folder = Path(node_local_dir(run_id, NODE.label)) / "wandb" / f"offline-run-{run_id}"
    folder.mkdir(parents=True)
    (folder / f"run-{run_id}.wandb").write_bytes(b"x" * size)


def test_the_packed_run_says_where_its_archive_is_and_its_size() -> None:
    runs = NodeRuns()
    assert runs.pack_offline("empty", NODE.label) == PackedRun(archive=None, size=0)
    node_run("r1", 50_000)
    packed = runs.pack_offline("r1", NODE.label)
    assert packed.archive is not None and Path(packed.archive).stat().st_size == packed.size > 0
    above = runs.pack_offline("r1", NODE.label, max_bytes=packed.size - 1)  # the archive is removed, the folder stays
    assert above == PackedRun(archive=None, size=packed.size) and not Path(packed.archive).exists()
    assert Path(node_local_dir("r1", NODE.label)).is_dir()
    with pytest.raises(dataclasses.FrozenInstanceError):
        packed.size = 0  # type: ignore[misc]


def collected(tmp_path: Path, run_id: str) -> dict[str, Any]:
    """Collect ``run_id`` from the node through Ray's route; its entry in the run's index."""
    index = open_index(str(tmp_path / "driver" / run_id), run_id=run_id, project="p", name=None, group=None)
    handle = LoggerHandle(node=NODE, actor=Remote(NodeRuns()), pg=None)
    job = CollectJob(run_id=run_id, index=index, role=Role.NODE, deadline=time.monotonic() + 30)
    OfflineCollection(Warner()).collect(job, handle)
    (entry,) = index.data["writers"]
    return dict(entry)


def test_the_collection_reads_the_packed_run_to_bring_it_over(tmp_path: Path) -> None:
    node_run("r2", 50_000)
    entry = collected(tmp_path, "r2")
    assert entry["state"] == "collected" and entry["via"] == "ray" and entry["bytes"] > 0
    brought = tmp_path / "driver" / "r2" / "nodes" / NODE.label / "wandb" / "offline-run-r2" / "run-r2.wandb"
    assert brought.stat().st_size == 50_000
    assert not Path(node_local_dir("r2", NODE.label)).exists()  # the node's copy is removed once brought


def test_the_collection_names_an_empty_run_and_one_above_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert collected(tmp_path, "nothing")["state"] == "empty"
    node_run("big", 50_000)
    monkeypatch.setattr(_collect, "MAX_COLLECT_BYTES", 100)
    entry = collected(tmp_path, "big")
    assert entry["state"] == "left-on-node" and "above the 100 bytes brought through Ray" in entry["error"]
    assert entry["source"] == f"host-1:{node_local_dir('big', NODE.label)}"
