"""The transaction-log reader against offline runs that the real wandb client wrote: every
history row and stats sample, blocks and chunks, and damaged logs named by file and offset
(while ``report`` still summarises every other node).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes import cli
from ray_wandb_nodes._wandb.txlog import (
    BLOCK_SIZE,
    TransactionLogError,
    cut_to_whole_records,
    read_run,
    whole_records_end,
)
from ray_wandb_nodes.report.summary import load
from tests.support.offline import copy_folder, offline_run

__all__ = ["offline_run"]  # the shared fixture, imported for pytest to find


def test_not_a_transaction_log(tmp_path: Path) -> None:
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"hello world, not wandb")
    with pytest.raises(TransactionLogError, match=r"run-x.wandb: not a W&B transaction log .* at byte offset 0"):
        read_run(str(bad))


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


def test_a_log_is_whole_up_to_its_last_whole_record(offline_run: dict[str, Any], tmp_path: Path) -> None:
    """A finished log is whole to its end; one whose writer ended inside a record (its last block
    never written, or a chunk cut short) ends after the record before; a zero trailer after a
    whole record is not cut; damage before the end is an error, never a cut."""
    data = offline_run["files"]["node-primary-aaaaaa"].read_bytes()
    path = tmp_path / "run-x.wandb"
    path.write_bytes(data)
    assert whole_records_end(str(path)) == len(data) and cut_to_whole_records(str(path)) == 0
    offsets = chunk_offsets(data)
    first = next(o for o in offsets if o < BLOCK_SIZE and data[o + 6] == 2)  # runs over the first block's end
    path.write_bytes(data[:BLOCK_SIZE])
    assert whole_records_end(str(path)) == first
    assert cut_to_whole_records(str(path)) == BLOCK_SIZE - first and path.stat().st_size == first
    assert read_run(str(path)).error is None and cut_to_whole_records(str(path)) == 0
    full = next(o for o in offsets if data[o + 6] == 1)  # a FULL chunk: cut 3 bytes into its payload
    path.write_bytes(data[: full + 10])
    assert whole_records_end(str(path)) == full
    path.write_bytes(data[:full] + bytes(3))  # zeros after a whole record: nothing to cut
    assert whole_records_end(str(path)) == full + 3
    damaged = bytearray(data)
    damaged[full + 9] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(TransactionLogError, match=f"checksum mismatch at byte offset {full}"):
        cut_to_whole_records(str(path))
