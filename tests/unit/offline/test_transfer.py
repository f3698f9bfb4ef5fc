"""The offline folder's pieces (pure): the index, packing a node's run and receiving and merging
it on the driver side, and the route through the run's storage.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest


def test_an_index_reopened_keeps_what_the_folder_already_lists(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.index import OfflineIndex, open_index

    folder = str(tmp_path / "run")
    first = OfflineIndex(folder, run_id="r", project="p", name="n", group=None)
    first.set_writer({"role": "node", "label": "node-a", "state": "left-on-node"})
    first.update(exit_code=1)
    again = open_index(folder, run_id="r", project="p", name="n", group=None)
    assert again is open_index(folder, run_id="r", project="p", name="n", group=None)
    again.set_writer({"role": "primary", "label": "node-p", "state": "written"})
    data = json.loads((tmp_path / "run" / "index.json").read_text())
    assert [(w["role"], w["label"]) for w in data["writers"]] == [("primary", "node-p"), ("node", "node-a")]
    assert data["exit_code"] == 1
    assert sorted(os.listdir(folder)) == ["index.json"]  # no temp file left behind


def test_a_second_archive_of_one_node_is_merged_next_to_the_first(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.transfer import pack, read_chunk, receive

    dest = tmp_path / "collected" / "node-a"
    for n in (1, 2):
        src = tmp_path / f"node-{n}"
        (src / "wandb" / f"offline-run-{n}").mkdir(parents=True)
        (src / "wandb" / f"offline-run-{n}" / "run-x.wandb").write_bytes(b"x" * (5000 * n))
        (src / "wandb" / "latest-run").symlink_to(src / "wandb" / f"offline-run-{n}")
        archive, size = pack(str(src))
        receive(lambda offset, a=archive: read_chunk(a, offset, 1024), size, str(dest), time.monotonic() + 30)
    assert sorted(p.name for p in (dest / "wandb").iterdir()) == ["offline-run-1", "offline-run-2"]
    assert (dest / "wandb" / "offline-run-2" / "run-x.wandb").stat().st_size == 10000
    assert sorted(p.name for p in dest.parent.iterdir()) == ["node-a"]  # nothing half-done beside it


def test_a_receive_that_runs_out_of_time_leaves_nothing_behind(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.transfer import pack, read_chunk, receive

    src = tmp_path / "node"
    (src / "wandb").mkdir(parents=True)
    (src / "wandb" / "run-x.wandb").write_bytes(os.urandom(200_000))
    archive, size = pack(str(src))
    dest = tmp_path / "collected" / "node-a"
    with pytest.raises(TimeoutError, match="bytes received before the deadline"):
        receive(lambda offset: read_chunk(archive, offset, 1000), size, str(dest), time.monotonic() - 1)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


# through the run's storage ---------------------------------------------------------------------
def test_the_route_is_the_storage_when_every_node_reaches_it_else_ray(tmp_path: Path) -> None:
    import fsspec
    import pyarrow.fs

    from ray_wandb_nodes.offline.storage import Transfer, storage_spot

    root = str(tmp_path)
    local = pyarrow.fs.SubTreeFileSystem(root, pyarrow.fs.LocalFileSystem())
    custom = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fsspec.filesystem("file")))  # as s3fs would be
    assert storage_spot(Transfer.RAY, "s3://bucket/exp", None) == (None, None)
    assert storage_spot(Transfer.AUTO, f"{root}/exp", None) == (None, None)  # a local path: maybe each node's own
    assert storage_spot(Transfer.AUTO, "exp", local) == (None, None)  # a local one under another name
    spot, why_not = storage_spot(Transfer.AUTO, f"{root}/exp", custom)
    assert why_not is None and spot is not None
    assert spot.filesystem is custom and spot.path == f"{root}/exp/ray_wandb_nodes"
    run = spot.for_run("run-1")
    assert run.path == f"{root}/exp/ray_wandb_nodes/run-1" and run.file("n") == f"{run.path}/n.tar.gz"
    spot, why_not = storage_spot(Transfer.STORAGE, f"{root}/exp/", None)  # said so: also a local path (NFS)
    assert spot is not None and spot.uri == f"local://{root}/exp/ray_wandb_nodes"
    spot, why_not = storage_spot(Transfer.STORAGE, "nosuchscheme://bucket/exp", None)
    assert spot is None and why_not is not None and "'nosuchscheme://bucket/exp'" in why_not
    assert storage_spot(Transfer.AUTO, None, None) == (None, None)
    assert storage_spot(Transfer.STORAGE, None, None) == (None, "the run has no storage path")


def _node_folder(root: Path) -> Path:
    src = root / "node-run"
    (src / "wandb" / "offline-run-1").mkdir(parents=True)
    (src / "wandb" / "offline-run-1" / "run-x.wandb").write_bytes(os.urandom(300_000))
    return src


def test_a_node_run_comes_through_the_storage_and_leaves_nothing_there(tmp_path: Path) -> None:
    import pyarrow.fs

    from ray_wandb_nodes._fleet.node_logger import NodeLogger
    from ray_wandb_nodes.offline.storage import Transfer, fetch, remove, remove_folder_if_empty, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    custom = pyarrow.fs.SubTreeFileSystem(str(bucket), pyarrow.fs.LocalFileSystem())
    experiment, _ = storage_spot(Transfer.STORAGE, "exp", custom)
    assert experiment is not None
    spot = experiment.for_run("run-1")
    src = _node_folder(tmp_path)
    archive, size = pack(str(src))
    assert NodeLogger().put_offline(archive, spot, "node-a", 30.0) == "exp/ray_wandb_nodes/run-1/node-a.tar.gz"
    assert (bucket / "exp" / "ray_wandb_nodes" / "run-1" / "node-a.tar.gz").stat().st_size == size
    dest = tmp_path / "collected" / "nodes" / "node-a"
    fetch(spot, "node-a", size, str(dest), time.monotonic() + 30)
    got = dest / "wandb" / "offline-run-1" / "run-x.wandb"
    assert got.read_bytes() == (src / "wandb" / "offline-run-1" / "run-x.wandb").read_bytes()
    remove(spot, "node-a")
    remove_folder_if_empty(spot)
    # The run's folder is gone; the one above it stays on a non-local store (a run may be
    # collecting beside it, and object stores keep no empty folders).
    assert list((bucket / "exp" / "ray_wandb_nodes").iterdir()) == []


def test_a_storage_the_driver_side_sees_differently_is_refused_and_nothing_is_unpacked(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.storage import Transfer, fetch, put, remove_folder_if_empty, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    experiment, _ = storage_spot(Transfer.STORAGE, str(tmp_path / "exp"), None)
    assert experiment is not None
    spot = experiment.for_run("run-1")
    archive, size = pack(str(_node_folder(tmp_path)))
    dest = tmp_path / "collected" / "node-a"
    # Not there at all (each node has its own local path): the file is named.
    with pytest.raises(FileNotFoundError, match=r"node-a\.tar\.gz"):
        fetch(spot, "node-a", size, str(dest), time.monotonic() + 30)
    # Another node's or an old copy of another size: both sizes are named.
    stored = put(archive, spot, "node-a", 30.0)
    with open(stored, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(OSError, match=f"holds {size - 10} bytes, the node packed {size}"):
        fetch(spot, "node-a", size, str(dest), time.monotonic() + 30)
    assert not dest.exists()
    remove_folder_if_empty(spot)  # not empty: kept
    assert os.path.exists(stored)


def test_a_copy_that_would_come_too_late_is_not_made(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.storage import Transfer, put, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    experiment, _ = storage_spot(Transfer.STORAGE, str(tmp_path / "exp"), None)
    assert experiment is not None
    archive, _ = pack(str(_node_folder(tmp_path)))
    with pytest.raises(TimeoutError, match="no time left to copy to local://"):
        put(archive, experiment.for_run("run-1"), "node-a", 0.0)
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0], ids=["node-clock-behind", "node-clock-ahead"])
def test_a_node_copies_within_the_duration_it_is_handed_whatever_its_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    from ray_wandb_nodes.offline import storage
    from ray_wandb_nodes.offline.transfer import pack

    experiment, _ = storage.storage_spot(storage.Transfer.STORAGE, str(tmp_path / "exp"), None)
    assert experiment is not None
    spot = experiment.for_run("run-1")
    archive, size = pack(str(_node_folder(tmp_path)))
    real = time.time
    monkeypatch.setattr(storage.time, "time", lambda: real() + skew_s)  # the node's clock is off by an hour
    assert os.path.getsize(storage.put(archive, spot, "node-a", 30.0)) == size
    # A copy whose time runs out mid-way stops there, and leaves nothing in the storage.
    clock = iter([0.0, 0.0, 31.0])  # the start, the first chunk, then past the 30 s handed over
    monkeypatch.setattr(storage.time, "monotonic", lambda: next(clock, 31.0))
    monkeypatch.setattr(storage, "CHUNK_BYTES", max(1, size // 3))
    with pytest.raises(TimeoutError, match="before the deadline"):
        storage.put(archive, spot, "node-b", 30.0)
    assert not os.path.exists(spot.file("node-b"))
