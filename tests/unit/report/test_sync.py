"""``sync`` of an offline run that the real wandb client wrote: what it uploads into one run (the
stats equal to what the reader reads), the plan when not logged in, and writers the index names
without a file here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes import cli
from ray_wandb_nodes._wandb.txlog import BLOCK_SIZE, read_run
from tests.support.offline import console_text, copy_folder, offline_run
from tests.support.wandb_backend import WandbTestBackend
from tests.unit.wandb.test_txlog import chunk_offsets

__all__ = ["offline_run"]  # the shared fixture, imported for pytest to find


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
        # The ranks' console lines each node writer wrote, under that node's label (the label is a
        # setting of the process that syncs, not in the records).
        nodes = sorted(label for label in offline_run["files"] if label != "node-primary-aaaaaa")
        assert sorted((x.label, x.text) for x in run.console()) == [(label, console_text(label)) for label in nodes]


def test_a_log_that_ends_inside_a_record_is_cut_after_its_last_whole_one_and_synced(
    offline_run: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer's process ended before it wrote its last block out (wandb-core writes its log a
    whole 32 KiB block at a time: a relayed writer whose relay died, a node lost): wandb's sync
    refuses the file ("the file ends with an incomplete record"). Cut after its last whole record,
    every record before it goes up."""
    folder = copy_folder(offline_run, tmp_path)
    label = "node-primary-aaaaaa"  # its log spans blocks: a record runs over the first block's end
    path = next(folder.glob("primary/**/run-*.wandb"))
    data = path.read_bytes()
    first = next(o for o in chunk_offsets(data) if o < BLOCK_SIZE and data[o + 6] == 2)  # a FIRST chunk
    path.write_bytes(data[:BLOCK_SIZE])  # the first block alone, as a killed wandb-core leaves it
    whole = read_run(str(path), strict=False)
    assert whole.error is not None and "truncated record" in str(whole.error) and whole.error.offset == first
    with WandbTestBackend() as backend:
        monkeypatch.setenv("WANDB_BASE_URL", backend.base_url)
        capsys.readouterr()
        assert cli.main(["sync", str(folder)]) == 0
        out = capsys.readouterr().out
        assert f"note  {label}: its log ended inside a record" in out and f"the last {BLOCK_SIZE - first} bytes" in out
        assert "wandb sync uploads what precedes the damage" not in out
        (run,) = backend.runs.values()
        assert path.stat().st_size == first and read_run(str(path)).error is None
        got = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]
        assert got == [{k: v for k, v in row.items() if not k.startswith("_")} for row in whole.history]
