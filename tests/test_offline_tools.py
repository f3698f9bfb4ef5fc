"""The transaction-log reader, ``report`` and ``sync`` against offline runs that the real
wandb client wrote in this test, without Ray: a primary with history and two labelled node
writers of one run id, as the plugin writes them offline.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import unique
from wandb_backend import WandbTestBackend

from ray_wandb_nodes import cli
from ray_wandb_nodes.offline.report import NodeSummary, RunReport, flag, load
from ray_wandb_nodes.offline.txlog import BLOCK_SIZE, RunLog, TransactionLogError, read_run

WIDE_KEYS = 3000  # one history row larger than a 32 KiB block: FIRST, MIDDLE, LAST chunks


def write_offline_run(folder: Path, run_id: str, label: str, rows: list[dict[str, Any]]) -> Path:
    import wandb

    run = wandb.init(
        id=run_id,
        project="offline-tools",
        dir=str(folder),
        mode="offline",
        config={"lr": 0.1} if rows else None,
        reinit="create_new",
        settings=wandb.Settings(x_label=label, x_stats_sampling_interval=0.3, console="off"),
    )
    for row in rows:
        run.log(row)
        time.sleep(0.2)
    time.sleep(1.2)  # a few stats samples
    run.finish()
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    return path


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run folder: the primary's offline run and two node writers', with an index."""
    base = tmp_path_factory.mktemp("offline-run")
    run_id = unique("tools")
    rows: list[dict[str, Any]] = [{"loss": 1.0 / (i + 1), "epoch": i} for i in range(4)]
    rows.append({f"wide/{i:04d}": float(i) for i in range(WIDE_KEYS)})
    files = {
        "node-primary-aaaaaa": write_offline_run(base / "primary", run_id, "node-primary-aaaaaa", rows),
        "node-w1-bbbbbb": write_offline_run(base / "nodes" / "node-w1-bbbbbb", run_id, "node-w1-bbbbbb", []),
        "node-w2-cccccc": write_offline_run(base / "nodes" / "node-w2-cccccc", run_id, "node-w2-cccccc", []),
    }
    index = {
        "format": "ray_wandb_nodes.offline/1",
        "run_id": run_id,
        "project": "offline-tools",
        "exit_code": 0,
        "writers": [
            {
                "role": "primary" if label == "node-primary-aaaaaa" else "node",
                "label": label,
                "state": "collected",
                "path": os.path.relpath(path.parent, base),
            }
            for label, path in files.items()
        ],
    }
    (base / "index.json").write_text(json.dumps(index))
    return {"folder": base, "run_id": run_id, "rows": rows, "files": files}


def copy_folder(offline_run: dict[str, Any], tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(offline_run["folder"], dest, symlinks=True)
    return dest


def test_reader_returns_the_history_rows_logged_and_every_stats_sample(offline_run: dict[str, Any]) -> None:
    log = read_run(str(offline_run["files"]["node-primary-aaaaaa"]))
    assert log.run_id == offline_run["run_id"] and log.project == "offline-tools"
    assert log.config == {"lr": 0.1}
    assert log.exit_code == 0
    got = [{k: v for k, v in row.items() if not k.startswith("_")} for row in log.history]
    assert got == offline_run["rows"]
    assert [row["_step"] for row in log.history] == list(range(5))
    assert log.labels == ["node-primary-aaaaaa"]
    assert log.record_counts["stats"] == len(log.stats["node-primary-aaaaaa"]) >= 2
    assert os.path.getsize(offline_run["files"]["node-primary-aaaaaa"]) > BLOCK_SIZE  # spans blocks


def test_reader_stats_equal_what_wandb_itself_uploads_from_the_same_files(
    offline_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wandb-core's own reader (``wandb sync``) is the ground truth for every stats value."""
    folder = copy_folder(offline_run, tmp_path)
    with WandbTestBackend() as backend:
        monkeypatch.setenv("WANDB_BASE_URL", backend.base_url)
        assert cli.main(["sync", str(folder)]) == 0
        (run,) = backend.runs.values()
        assert run.run_id == offline_run["run_id"]
        assert run.labels == set(offline_run["files"])
        uploaded = run.system_metrics()
        for label, path in offline_run["files"].items():
            samples = read_run(str(path)).stats[label]
            for metric in ("memory_percent", "proc.memory.rssMB", "network.sent"):
                assert uploaded[label][metric] == [values[metric] for _, values in samples if metric in values]
        got = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]
        assert got == offline_run["rows"]
        assert [c.exit_code for c in run.completes] == [0]  # only the primary sets the run's state


def test_sync_refuses_clearly_when_not_logged_in(
    offline_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert cli.main(["sync", str(offline_run["folder"])]) == 2
    err = capsys.readouterr().err
    assert "not logged in" in err and "wandb login" in err and "WANDB_API_KEY" in err
    # A dry run says the same and what it would upload, in order: primary first.
    assert cli.main(["sync", str(offline_run["folder"]), "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("would sync")]
    assert [line.split()[3] for line in lines] == ["primary", "node", "node"]
    assert "not logged in" in out


def damage(path: Path, how: str) -> int:
    """Damage the file at ``path``; returns the byte offset of the chunk the damage hits."""
    data = bytearray(path.read_bytes())
    offsets = chunk_offsets(bytes(data))
    target = offsets[len(offsets) // 2]
    if how == "truncate":
        path.write_bytes(bytes(data[: target + 10]))
    else:
        data[target + 9] ^= 0xFF  # a payload byte: the checksum no longer matches
        path.write_bytes(bytes(data))
    return target


def chunk_offsets(data: bytes) -> list[int]:
    """Offsets of the chunk headers of a well-formed log (independent of the reader)."""
    out, pos = [], 7
    while pos + 7 <= len(data):
        left = BLOCK_SIZE - pos % BLOCK_SIZE
        if left < 7:
            pos += left
            continue
        crc, length, ctype = struct.unpack("<IHB", data[pos : pos + 7])
        if (crc, length, ctype) == (0, 0, 0):
            pos += left
            continue
        assert zlib.crc32(data[pos + 7 : pos + 7 + length], zlib.crc32(bytes([ctype]))) == crc
        out.append(pos)
        pos += 7 + length
    return out


@pytest.mark.parametrize(
    ("how", "reason"), [("truncate", "truncated"), ("corrupt", "checksum mismatch")], ids=["truncated", "corrupted"]
)
def test_a_damaged_log_names_file_and_offset_and_the_other_nodes_are_still_reported(
    offline_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, reason: str
) -> None:
    folder = copy_folder(offline_run, tmp_path)
    damaged = next(folder.glob("nodes/node-w1-bbbbbb/**/run-*.wandb"))
    offset = damage(damaged, how)

    with pytest.raises(TransactionLogError) as info:
        read_run(str(damaged))
    assert info.value.path == str(damaged) and info.value.offset == offset
    assert reason in str(info.value) and str(damaged) in str(info.value) and f"byte offset {offset}" in str(info.value)
    partial = read_run(str(damaged), strict=False)
    assert partial.error is not None and partial.error.offset == offset
    assert 0 < sum(partial.record_counts.values())

    capsys.readouterr()
    assert cli.main(["report", str(folder)]) == 1
    out = capsys.readouterr().out
    for label in offline_run["files"]:
        assert label in out
    assert f"{damaged}: {reason}" in out and f"byte offset {offset}" in out
    (report,) = load(str(folder))
    samples = {n.label: n.samples for n in report.nodes}
    assert samples["node-w2-cccccc"] == len(
        read_run(str(offline_run["files"]["node-w2-cccccc"])).stats["node-w2-cccccc"]
    )
    assert samples["node-primary-aaaaaa"] >= 2


def test_not_a_transaction_log(tmp_path: Path) -> None:
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"hello world, not wandb")
    with pytest.raises(TransactionLogError, match=r"run-x.wandb: not a W&B transaction log .* at byte offset 0"):
        read_run(str(bad))


def test_report_text_json_and_png(
    offline_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "nodes.png"
    assert cli.main(["report", str(offline_run["folder"]), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    paths = (str(offline_run["folder"]), str(png))
    report_lines = [line for line in out.splitlines() if not any(p in line for p in paths)]
    assert all(len(line) <= 100 for line in report_lines), out
    assert f"Run {offline_run['run_id']}" in out and "history 5 rows" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert cli.main(["report", str(offline_run["folder"]), "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert {n["label"]: n["role"] for n in run["nodes"]} == {
        "node-primary-aaaaaa": "primary",
        "node-w1-bbbbbb": "node",
        "node-w2-cccccc": "node",
    }
    for n in run["nodes"]:
        log = read_run(str(offline_run["files"][n["label"]]))
        memory = [v["memory_percent"] for _, v in log.stats[n["label"]] if "memory_percent" in v]
        assert n["samples"] == len(log.stats[n["label"]])
        assert n["mem_mean"] == pytest.approx(sum(memory) / len(memory)) and n["mem_max"] == max(memory)


def test_cli_errors_name_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "missing' is not a folder" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no W&B runs in" in capsys.readouterr().err


# outliers (pure) -------------------------------------------------------------------------------
def synthetic(label: str, gpu_util: float, cpu: float = 50.0, workers: bool | None = None) -> RunLog:
    samples = [
        (float(t), {"cpu": cpu, "memory_percent": 40.0, "gpu.0.gpu": gpu_util, "gpu.1.gpu": gpu_util,
                    "gpu.0.memoryAllocated": 70.0, "network.sent": 1e6 * t, "network.recv": 2e6 * t})
        for t in range(10)
    ]  # fmt: skip
    return RunLog(path=f"/x/{label}/run-r.wandb", run_id="r", stats={label: samples})


def report_of(*logs: RunLog) -> RunReport:
    from ray_wandb_nodes.offline.report import summarise

    return summarise("r", "/x", list(logs))


def test_a_node_far_below_the_others_is_flagged_and_only_that_node() -> None:
    report = report_of(*(synthetic(f"n{i}", 95.0) for i in range(4)), synthetic("slow", 40.0))
    flags = {n.label: n.flags for n in report.nodes}
    assert flags.pop("slow") == ["GPU utilisation 40.0% vs 95.0% (median of the other 4 nodes)"]
    assert all(f == [] for f in flags.values())
    slow = next(n for n in report.nodes if n.label == "slow")
    assert [(g.index, g.util_mean, g.mem_mean) for g in slow.gpus] == [(0, 40.0, 70.0), (1, 40.0, None)]
    assert slow.net_sent_bps == pytest.approx(1e6) and slow.net_recv_bps == pytest.approx(2e6)


def test_small_differences_and_two_node_runs_are_not_flagged() -> None:
    close = report_of(synthetic("a", 95.0), synthetic("b", 90.0), synthetic("c", 80.0, cpu=60.0))
    assert all(n.flags == [] for n in close.nodes)
    two = report_of(synthetic("a", 95.0), synthetic("b", 10.0))
    assert all(n.flags == [] for n in two.nodes) and "3 or more" in two.notes[0]


def test_only_nodes_with_workers_are_compared_when_the_index_says_which() -> None:
    nodes = [NodeSummary(label=f"w{i}", role="node", samples=5, cpu_mean=90.0, workers=True) for i in range(3)]
    nodes.append(NodeSummary(label="head", role="primary", samples=5, cpu_mean=2.0, workers=False))
    report = RunReport(run_id="r", folder="/x", nodes=nodes)
    flag(report)
    assert all(n.flags == [] for n in report.nodes)


def test_a_writer_the_index_names_but_the_folder_lacks_is_reported_and_named_by_sync(
    offline_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = copy_folder(offline_run, tmp_path)
    index = json.loads((folder / "index.json").read_text())
    index["writers"].append(
        {
            "role": "node",
            "label": "node-w3-dddddd",
            "state": "left-on-node",
            "source": "w3:/tmp/ray_wandb_nodes/offline/x/node-w3-dddddd",
            "error": "TimeoutError: 10 of 20 bytes received before the deadline",
        }
    )
    (folder / "index.json").write_text(json.dumps(index))
    capsys.readouterr()
    assert cli.main(["report", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "node-w3-dddddd: no data here: left-on-node (w3:/tmp/ray_wandb_nodes/offline/x/node-w3-dddddd)" in out
    assert cli.main(["sync", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "note: node-w3-dddddd is not in this folder (left-on-node: TimeoutError" in out
    assert "its data is at w3:/tmp/ray_wandb_nodes/offline/x/node-w3-dddddd" in out


# the offline folder's pieces (pure) ------------------------------------------------------------
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


def test_zero_padding_inside_a_record_is_an_error(offline_run: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "run-x.wandb"
    data = bytearray(offline_run["files"]["node-primary-aaaaaa"].read_bytes())
    first = next(o for o in chunk_offsets(bytes(data)) if data[o + 6] == 2)  # a FIRST chunk
    length = struct.unpack("<H", data[first + 4 : first + 6])[0]
    after = first + 7 + length
    data[after : after + 7] = bytes(7)  # where its MIDDLE/LAST chunk starts
    path.write_bytes(bytes(data))
    with pytest.raises(TransactionLogError, match=f"zero padding inside a record at byte offset {after}"):
        read_run(str(path))


# through the run's storage ---------------------------------------------------------------------
def test_the_route_is_the_storage_when_every_node_reaches_it_else_ray(tmp_path: Path) -> None:
    import fsspec
    import pyarrow.fs

    from ray_wandb_nodes.offline.storage import storage_spot

    root = str(tmp_path)
    local = pyarrow.fs.SubTreeFileSystem(root, pyarrow.fs.LocalFileSystem())
    custom = pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fsspec.filesystem("file")))  # as s3fs would be
    assert storage_spot("ray", "s3://bucket/exp", None) == (None, None)
    assert storage_spot("auto", f"{root}/exp", None) == (None, None)  # a local path: maybe each node's own
    assert storage_spot("auto", "exp", local) == (None, None)  # a local one under another name
    spot, why_not = storage_spot("auto", f"{root}/exp", custom)
    assert why_not is None and spot is not None
    assert spot.filesystem is custom and spot.path == f"{root}/exp/ray_wandb_nodes"
    run = spot.for_run("run-1")
    assert run.path == f"{root}/exp/ray_wandb_nodes/run-1" and run.file("n") == f"{run.path}/n.tar.gz"
    spot, why_not = storage_spot("storage", f"{root}/exp/", None)  # said so: also a local path (NFS)
    assert spot is not None and spot.uri == f"local://{root}/exp/ray_wandb_nodes"
    spot, why_not = storage_spot("storage", "nosuchscheme://bucket/exp", None)
    assert spot is None and why_not is not None and "'nosuchscheme://bucket/exp'" in why_not
    assert storage_spot("auto", None, None) == (None, None)
    assert storage_spot("storage", None, None) == (None, "the run has no storage path")


def _node_folder(root: Path) -> Path:
    src = root / "node-run"
    (src / "wandb" / "offline-run-1").mkdir(parents=True)
    (src / "wandb" / "offline-run-1" / "run-x.wandb").write_bytes(os.urandom(300_000))
    return src


def test_a_node_run_comes_through_the_storage_and_leaves_nothing_there(tmp_path: Path) -> None:
    import pyarrow.fs

    from ray_wandb_nodes._node_logger import NodeLogger
    from ray_wandb_nodes.offline.storage import fetch, remove, remove_folder_if_empty, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    custom = pyarrow.fs.SubTreeFileSystem(str(bucket), pyarrow.fs.LocalFileSystem())
    experiment, _ = storage_spot("storage", "exp", custom)
    assert experiment is not None
    spot = experiment.for_run("run-1")
    src = _node_folder(tmp_path)
    archive, size = pack(str(src))
    assert (
        NodeLogger().put_offline(archive, spot, "node-a", time.time() + 30) == "exp/ray_wandb_nodes/run-1/node-a.tar.gz"
    )
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
    from ray_wandb_nodes.offline.storage import fetch, put, remove_folder_if_empty, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    experiment, _ = storage_spot("storage", str(tmp_path / "exp"), None)
    assert experiment is not None
    spot = experiment.for_run("run-1")
    archive, size = pack(str(_node_folder(tmp_path)))
    dest = tmp_path / "collected" / "node-a"
    # Not there at all (each node has its own local path): the file is named.
    with pytest.raises(FileNotFoundError, match=r"node-a\.tar\.gz"):
        fetch(spot, "node-a", size, str(dest), time.monotonic() + 30)
    # Another node's or an old copy of another size: both sizes are named.
    stored = put(archive, spot, "node-a", time.time() + 30)
    with open(stored, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(OSError, match=f"holds {size - 10} bytes, the node packed {size}"):
        fetch(spot, "node-a", size, str(dest), time.monotonic() + 30)
    assert not dest.exists()
    remove_folder_if_empty(spot)  # not empty: kept
    assert os.path.exists(stored)


def test_a_copy_that_would_come_too_late_is_not_made(tmp_path: Path) -> None:
    from ray_wandb_nodes.offline.storage import put, storage_spot
    from ray_wandb_nodes.offline.transfer import pack

    experiment, _ = storage_spot("storage", str(tmp_path / "exp"), None)
    assert experiment is not None
    archive, _ = pack(str(_node_folder(tmp_path)))
    with pytest.raises(TimeoutError, match="no time left to copy to local://"):
        put(archive, experiment.for_run("run-1"), "node-a", time.time() - 1)
    assert not (tmp_path / "exp").exists()
