"""Read wandb's transaction log (the ``run-<id>.wandb`` file of every offline or online run).

The file is the LevelDB log format after a 7-byte W&B header: ``:W&B``, magic ``0xBEE1``
(uint16, little-endian) and a version byte 0. The rest is 32 KiB blocks of chunks, each
with a 7-byte header ``<crc32 uint32><length uint16><type uint8>``; the CRC is the IEEE
CRC-32 of the type byte followed by the payload. A record is one FULL chunk, or FIRST,
MIDDLE..., LAST. A block with fewer than 7 bytes left is padded with zeros. Each record is
a ``wandb.proto.wandb_internal_pb2.Record``. The Go writer is wandb-core's
``core/pkg/leveldb`` and ``core/internal/transactionlog``.

The format is private to wandb; the header's magic and version guard against a change, and
every problem is a :class:`TransactionLogError` that names the file and the byte offset.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = 7
W_B_HEADER = b":W&B"
MAGIC = 0xBEE1
VERSION = 0
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
LABEL_SEP = "/l:"  # stats keys of a labelled writer: "<metric>/l:<label>"


class TransactionLogError(Exception):
    """A transaction log that cannot be read past ``offset``."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: {reason} at byte offset {offset}")
        self.path = path
        self.offset = offset
        self.reason = reason


def _check_header(header: bytes, path: str) -> None:
    if len(header) < CHUNK_HEADER or header[:4] != W_B_HEADER:
        raise TransactionLogError(path, 0, "not a W&B transaction log (no ':W&B' header)")
    magic, version = struct.unpack("<HB", header[4:7])
    if magic != MAGIC:
        raise TransactionLogError(path, 4, f"unknown magic 0x{magic:04X} (expected 0x{MAGIC:04X})")
    if version != VERSION:
        raise TransactionLogError(path, 6, f"unsupported format version {version} (this reader knows {VERSION})")


class _Chunks:
    """Records from a log's blocks, fed one block at a time (a record may span blocks)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pending: bytearray | None = None
        self.pending_at = 0

    def feed(self, block: bytes, block_start: int, pos: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(offset, payload)`` of each record that ends in ``block``; raises on a bad byte. A
        block shorter than ``BLOCK_SIZE`` is the file's last."""
        path = self.path
        while True:
            left = len(block) - pos
            if left < CHUNK_HEADER:
                if len(block) < BLOCK_SIZE and left and any(block[pos:]):
                    raise TransactionLogError(path, block_start + pos, f"truncated chunk header ({left} bytes)")
                return
            at = block_start + pos
            crc, length, ctype = struct.unpack("<IHB", block[pos : pos + CHUNK_HEADER])
            if crc == 0 and length == 0 and ctype == 0:
                if self.pending is not None:
                    raise TransactionLogError(path, at, "zero padding inside a record")
                return  # zero padding up to the end of the block
            if ctype not in (FULL, FIRST, MIDDLE, LAST):
                raise TransactionLogError(path, at, f"unknown chunk type {ctype}")
            end = pos + CHUNK_HEADER + length
            if end > len(block):
                if len(block) < BLOCK_SIZE:
                    raise TransactionLogError(
                        path, at, f"truncated chunk ({len(block) - pos - CHUNK_HEADER} of {length} payload bytes)"
                    )
                raise TransactionLogError(path, at, f"chunk length {length} runs past its block")
            payload = block[pos + CHUNK_HEADER : end]
            if zlib.crc32(payload, zlib.crc32(bytes([ctype]))) & 0xFFFFFFFF != crc:
                raise TransactionLogError(path, at, "checksum mismatch")
            pos = end
            if ctype in (FULL, FIRST) and self.pending is not None:
                raise TransactionLogError(path, at, "record started at an earlier chunk was never finished")
            if ctype == FULL:
                yield at, payload
            elif ctype == FIRST:
                self.pending, self.pending_at = bytearray(payload), at
            elif self.pending is None:
                raise TransactionLogError(path, at, "continuation chunk without a first chunk")
            else:
                self.pending += payload
                if ctype == LAST:
                    yield self.pending_at, bytes(self.pending)
                    self.pending = None


def iter_chunks(f: BinaryIO, path: str) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` of every record in ``f``, in order; raises on the first bad byte."""
    header = f.read(CHUNK_HEADER)
    _check_header(header, path)
    chunks = _Chunks(path)
    block_start, block, pos = 0, header + f.read(BLOCK_SIZE - CHUNK_HEADER), CHUNK_HEADER
    while block:
        yield from chunks.feed(block, block_start, pos)
        if len(block) < BLOCK_SIZE:  # end of file
            break
        block_start += BLOCK_SIZE
        block, pos = f.read(BLOCK_SIZE), 0
    if chunks.pending is not None:
        raise TransactionLogError(path, chunks.pending_at, "truncated record (the file ends inside it)")


class LogTail:
    """The records a live writer has added to its transaction log since the last read.

    wandb-core writes the log a 32 KiB block at a time (and, on wandb 0.31, the block in progress
    at each flush), so a live log grows by blocks, its last one partial: only complete blocks
    are read, and each block is read once. The last, partial block is the
    file's end only once the writer has finished: ``read(to_end=True)`` reads it then, and keeps
    it only when it holds the writer's exit record (``ended``; wandb's ``finish()`` can return
    before wandb-core has written the log out, so a partial block without it is read again
    later). A damaged block stops the tail (the error is kept in ``error``); nothing is ever
    written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._chunks = _Chunks(path)
        self._blocks = 0  # complete blocks read so far
        self.ended = False  # the writer's exit record was read: nothing more comes
        self.error: TransactionLogError | None = None

    def read(self, to_end: bool = False) -> list[Any]:
        """The records of the blocks completed since the last call (``Record`` messages);
        ``to_end``: the writer has finished, so its last, partial block too, once it is whole."""
        from google.protobuf.message import DecodeError

        if self.error is not None or self.ended:
            return []
        out: list[Any] = []
        try:
            with open(self.path, "rb") as f:
                f.seek(self._blocks * BLOCK_SIZE)
                while not self.ended:
                    block = f.read(BLOCK_SIZE)
                    if len(block) == BLOCK_SIZE:
                        out += self._records(block)
                        self._blocks += 1
                    else:
                        if to_end and block:
                            out += self._last(block)
                        break
        except FileNotFoundError:
            return out
        except (TransactionLogError, OSError, DecodeError) as e:
            self.error = e if isinstance(e, TransactionLogError) else TransactionLogError(self.path, 0, str(e))
        return out

    def _records(self, block: bytes) -> list[Any]:
        """The records that end in the next block; ``ended`` once the exit record is among them."""
        from wandb.proto import wandb_internal_pb2 as pb

        start = self._blocks * BLOCK_SIZE
        if self._blocks == 0:
            _check_header(block[:CHUNK_HEADER], self.path)
        out = []
        for _, raw in self._chunks.feed(block, start, CHUNK_HEADER if self._blocks == 0 else 0):
            record = pb.Record()
            record.ParseFromString(raw)
            out.append(record)
            self.ended |= record.WhichOneof("record_type") == "exit"
        return out

    def _last(self, block: bytes) -> list[Any]:
        """The finished log's last, partial block: its records once it holds the exit record;
        else none, and the block is read again next time (still being written out)."""
        pending, pending_at = self._chunks.pending, self._chunks.pending_at
        kept = bytes(pending) if pending is not None else None
        try:
            records = self._records(block)
        except TransactionLogError:  # cut mid-chunk: not all written out yet
            records = []
        if not self.ended:
            self._chunks.pending = bytearray(kept) if kept is not None else None
            self._chunks.pending_at = pending_at
            return []
        return records


def iter_records(path: str) -> Iterator[tuple[int, Any]]:
    """``(offset, Record)`` for every record of the file at ``path``."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        for offset, raw in iter_chunks(f, path):
            record = pb.Record()
            try:
                record.ParseFromString(raw)
            except DecodeError as e:
                raise TransactionLogError(path, offset, f"record does not decode ({e})") from None
            yield offset, record


@dataclass
class RunLog:
    """What one writer's transaction log holds, as plain data."""

    path: str
    run_id: str | None = None
    entity: str | None = None
    project: str | None = None
    name: str | None = None
    group: str | None = None
    start_time: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    # the keys the history rows were logged with: a logged table or other media object is one
    # key ("nodes"), where a row holds its reference's fields ("nodes/_type", "nodes/path", ...)
    keys: set[str] = field(default_factory=set)
    # label -> [(timestamp, {metric: value})]; "" for keys without a label
    stats: dict[str, list[tuple[float, dict[str, Any]]]] = field(default_factory=dict)
    exit_code: int | None = None
    record_counts: Counter[str] = field(default_factory=Counter)
    error: TransactionLogError | None = None  # set when reading stopped early (strict=False)

    @property
    def labels(self) -> list[str]:
        return sorted(self.stats)


def _value(value_json: str) -> Any:
    try:
        return json.loads(value_json)
    except ValueError:
        return value_json


def _item_key(item: Any) -> str:
    return str(item.key or "/".join(item.nested_key))


def _logged_keys(items: Any) -> set[str]:
    """The keys of one history record as they were logged: wandb-core writes a media object's
    reference (a ``wandb.Table``: ``{"_type": "table-file", "path": ...}``) as nested keys
    ``["nodes", "_type"]``, ...; a logged key with a slash (``"nodes/stragglers"``) stays one."""
    media = {tuple(i.nested_key[:-1]) for i in items if len(i.nested_key) > 1 and i.nested_key[-1] == "_type"}
    keys = set()
    for item in items:
        path = tuple(item.nested_key) if not item.key else (item.key,)
        parent = next((path[:n] for n in range(1, len(path)) if path[:n] in media), None)
        keys.add("/".join(parent or path))
    return keys


def split_label(key: str) -> tuple[str, str]:
    """``"cpu/l:node-a"`` -> ``("cpu", "node-a")``; an unlabelled key gets label ``""``."""
    metric, sep, label = key.rpartition(LABEL_SEP)
    return (metric, label) if sep else (key, "")


def read_run(path: str, *, strict: bool = True) -> RunLog:
    """Read the whole log at ``path``.

    With ``strict=False`` a damaged file gives what was read before the damage, with the
    :class:`TransactionLogError` in ``RunLog.error``; with ``strict=True`` it raises.
    """
    log = RunLog(path=path)
    try:
        for _, record in iter_records(path):
            _add(log, record)
    except TransactionLogError as e:
        if strict:
            raise
        log.error = e
    except OSError as e:
        err = TransactionLogError(path, 0, f"cannot be read ({e.strerror or e})")
        if strict:
            raise err from None
        log.error = err
    return log


def _seconds(timestamp: Any) -> float:
    """A protobuf Timestamp in seconds."""
    return float(timestamp.seconds + timestamp.nanos / 1e9)


def _add(log: RunLog, record: Any) -> None:
    kind = record.WhichOneof("record_type")
    log.record_counts[kind or "none"] += 1
    if kind == "history":
        log.history.append({_item_key(i): _value(i.value_json) for i in record.history.item})
        log.keys.update(_logged_keys(record.history.item))
    elif kind == "stats":
        when = _seconds(record.stats.timestamp)
        by_label: dict[str, dict[str, Any]] = {}
        for item in record.stats.item:
            metric, label = split_label(_item_key(item))
            by_label.setdefault(label, {})[metric] = _value(item.value_json)
        for label, values in by_label.items():
            log.stats.setdefault(label, []).append((when, values))
    elif kind == "run":
        run = record.run
        log.run_id = run.run_id or log.run_id
        log.entity = run.entity or log.entity
        log.project = run.project or log.project
        log.name = run.display_name or log.name
        log.group = run.run_group or log.group
        if run.start_time.seconds:
            log.start_time = _seconds(run.start_time)
        _update_config(log.config, run.config)
    elif kind == "config":
        _update_config(log.config, record.config)
    elif kind == "exit":
        log.exit_code = int(record.exit.exit_code)


def _update_config(config: dict[str, Any], record: Any) -> None:
    for item in record.update:
        key = _item_key(item)
        if key != "_wandb":
            config[key] = _value(item.value_json)
    for item in record.remove:
        config.pop(_item_key(item), None)


def whole_records_end(path: str) -> int:
    """The byte offset just past the last whole record of the log at ``path``: its size, unless
    it ends inside a record (a writer whose process ended before it wrote its last block out:
    the rest of that record was never written). Raises :class:`TransactionLogError` on a
    damaged byte before that."""
    with open(path, "rb") as f:
        _check_header(f.read(CHUNK_HEADER), path)
        f.seek(0)
        data = f.read()
    end = pos = CHUNK_HEADER
    inside = False  # a FIRST chunk read, its LAST not yet
    while pos + CHUNK_HEADER <= len(data):
        room = BLOCK_SIZE - pos % BLOCK_SIZE
        if room < CHUNK_HEADER:  # a block's zero trailer
            pos += room
            continue
        crc, length, ctype = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if crc == 0 and length == 0 and ctype == 0:
            pos += room  # zero padding up to the block's end
            continue
        if ctype not in (FULL, FIRST, MIDDLE, LAST) or length > room - CHUNK_HEADER:
            raise TransactionLogError(path, pos, f"unknown chunk type {ctype} or length {length}")
        if pos + CHUNK_HEADER + length > len(data):
            return end  # the file ends inside this chunk
        payload = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        if zlib.crc32(payload, zlib.crc32(bytes([ctype]))) & 0xFFFFFFFF != crc:
            raise TransactionLogError(path, pos, "checksum mismatch")
        pos += CHUNK_HEADER + length
        inside = ctype in (FIRST, MIDDLE)
        if not inside:
            end = pos
    tail = data[pos:]
    return end if inside or any(tail) else len(data)  # a chunk's first bytes, or zeros after the last


def cut_to_whole_records(path: str) -> int:
    """Cut the log at ``path`` after its last whole record, where it ends inside one (nothing
    can read the bytes of a record whose rest was never written; wandb's sync refuses the file
    while they are there): the bytes cut, 0 where it ended whole."""
    end = whole_records_end(path)
    size = os.path.getsize(path)
    if end >= size:
        return 0
    os.truncate(path, end)
    return size - end
