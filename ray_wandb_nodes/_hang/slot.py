"""A beacon's slot: its layout, what a reader decodes from it, and reading it from outside.

The rank writes its slot (``beacon.Beacon``); anything on the node reads it with ``pread`` (a file
read: it needs nothing from the rank's process, so a rank whose Python cannot run is read like any
other). A sequence counter (a seqlock: odd while a write is under way) lets the reader retry
instead of seeing a torn write.

Times are ``CLOCK_MONOTONIC`` nanoseconds, which only mean something on the host that took them:
the reader compares them with its own monotonic clock on the same node, and only ages (seconds
since progress) leave the node (:func:`progress_of`).

The slot, version 2, is 512 bytes (little-endian):

======  =====================================================================================
bytes   what
======  =====================================================================================
0       hang detection's sequence counter (u64): odd while the rank writes bytes 8-255
8       magic, version, phase, dump signal, pid, rank, process start (ticks), slot start (ns)
40      reports, steps, last progress (ns), thread of the last progress, phase since (ns)
80      the cadence: :data:`CADENCE_BUCKETS` pairs (bucket index, slowest interval ns in it),
        bucket ``i`` at ``80 + 16 * (i % CADENCE_BUCKETS)``; see :class:`beacon.Beacon`
176     free, hang detection's
256     RESERVED for another subsystem of the rank (the per-rank step anatomy): its own
        sequence counter (u64) at 256, odd while its writer writes, and its data at 264-511.
        Hang detection never writes there; :attr:`beacon.Beacon.extension` gives a writer the
        region, and :func:`read_slot` hands it back raw as :attr:`BeaconSlot.extension`,
        read only when both counters read the same, even, before and after.
======  =====================================================================================
"""

from __future__ import annotations

import enum
import os
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x52574E42  # "RWNB"
VERSION = 2
SLOT_SIZE = 512
EXTENSION_AT = 256  # bytes 256..511: another subsystem's (its own seqlock at 256), never hang detection's
SUFFIX = ".slot"
# The cadence's window: the slowest interval of each bucket of ten minutes, the last six buckets
# (the current one and five before: 50 to 60 minutes). Why: ``policy``'s module docstring.
CADENCE_BUCKET_NS = 600 * 10**9
CADENCE_BUCKETS = 6

SEQ = struct.Struct("<Q")  # offset 0 (hang detection's) and EXTENSION_AT (the extension's)
HEADER = struct.Struct("<IHBBiiQQ")  # offset 8: magic, version, phase, dump signal, pid, rank, proc start, start ns
PROGRESS = struct.Struct("<QQQQQ")  # offset 40: reports, steps, last progress ns, thread, phase since
STEP = struct.Struct("<QQQ")  # offset 48: steps, last progress ns, thread
BUCKET = struct.Struct("<QQ")  # bucket index, slowest interval ns of the bucket
HEADER_AT, PROGRESS_AT, STEP_AT, CADENCE_AT = 8, 40, 48, 80
_READ_TRIES = 50


class Phase(enum.IntEnum):
    """What a rank is doing between two stamps; a long phase is allowed longer (see ``policy``)."""

    RUNNING = 0
    CHECKPOINTING = 1
    EVALUATING = 2
    IN_REPORT = 3  # inside ``ray.train.report`` (Ray's report barrier)
    STARTING = 4  # armed, its train function not started yet (Ray's worker group start): not judged
    PREPARING = 5  # the user's own long preparation: a download, tokenisation, a compilation


# Allowed longer than a step: a save, an evaluation, a preparation of the user's own.
LONG_PHASES = frozenset({Phase.CHECKPOINTING, Phase.EVALUATING, Phase.PREPARING})


@dataclass(frozen=True)
class BeaconSlot:
    """One rank's slot as read on its node. Times are this host's monotonic nanoseconds."""

    path: Path
    pid: int
    rank: int
    phase: Phase
    dump_signal: int  # the signal the rank registered faulthandler on; 0: none (never signal it)
    start_ns: int  # when the slot was created
    reports: int
    steps: int
    last_progress_ns: int  # 0 until the first report or step
    thread_ident: int  # ``threading.get_ident()`` of the thread that last stamped progress
    phase_since_ns: int
    # (bucket index, slowest interval ns of the bucket) of the buckets written, oldest first:
    # intervals between progress, long phases and resolved hangs left out (see ``Beacon``)
    slow_intervals: tuple[tuple[int, int], ...] = ()
    extension: bytes = b""  # bytes 256..511 of the slot, raw: another subsystem's (module docstring)
    proc_start: int = 0  # the process's start time (``/proc/<pid>/stat``): tells it from a later one with its pid

    @property
    def started(self) -> bool:
        """Whether the rank has made any progress (a report or an optimizer step) yet."""
        return self.last_progress_ns > 0

    def slowest_recent_ns(self, now_ns: int) -> int:
        """The slowest interval of the cadence's window at ``now_ns`` (a monotonic time of this
        host): the buckets of the last ``CADENCE_BUCKETS`` ten minutes; 0 where none."""
        return recent_slowest_ns(self.slow_intervals, now_ns)


def recent_slowest_ns(buckets: Iterable[tuple[int, int]], now_ns: int) -> int:
    """The slowest interval of ``buckets`` ((index, slowest ns) pairs) still in the window at
    ``now_ns``: the current bucket and the ``CADENCE_BUCKETS - 1`` before it; 0 where none."""
    oldest = now_ns // CADENCE_BUCKET_NS - CADENCE_BUCKETS + 1
    return max((slowest for index, slowest in buckets if index >= oldest), default=0)


@dataclass(frozen=True)
class RankProgress:
    """What leaves the node about one rank's progress: counts and ages, never raw clock values."""

    rank: int
    pid: int
    reports: int
    steps: int
    started: bool
    age_s: float  # seconds since the last progress (since the slot was created, before any)
    phase: Phase
    phase_age_s: float
    # The slowest interval between progress of the last hour (the beacon's window), long phases
    # and resolved hangs left out; None where there is none (``"auto"``'s cadence, see ``policy``).
    slowest_interval_s: float | None
    dump_signal: int
    proc_start: int = 0  # its process's start time: an end names the process by it (see ``RankProcess``)


def progress_of(slot: BeaconSlot, now_ns: int) -> RankProgress:
    """Ages of ``slot`` against ``now_ns``, a monotonic time taken on the slot's own host."""
    since = slot.last_progress_ns if slot.started else slot.start_ns
    slowest = slot.slowest_recent_ns(now_ns)
    return RankProgress(
        rank=slot.rank,
        pid=slot.pid,
        reports=slot.reports,
        steps=slot.steps,
        started=slot.started,
        age_s=max(0.0, (now_ns - since) / 1e9),
        phase=slot.phase,
        phase_age_s=max(0.0, (now_ns - slot.phase_since_ns) / 1e9),
        slowest_interval_s=slowest / 1e9 if slowest else None,
        dump_signal=slot.dump_signal,
        proc_start=slot.proc_start,
    )


def slot_path(directory: Path, rank: int, pid: int) -> Path:
    """The slot file of ``rank`` in process ``pid``; the other per-rank files share its stem."""
    return Path(directory) / f"rank-{rank}.{pid}{SUFFIX}"


def process_start(pid: int) -> int:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22), 0 where unknown:
    tells a live process from a later one that reuses a dead rank's pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text.rsplit(")", 1)[1].split()[19])


def alive(pid: int, proc_start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return proc_start == 0 or process_start(pid) in (0, proc_start)


def read_slot(path: Path) -> BeaconSlot | None:
    """One slot, consistent (retried while a write is under way); None for a file that is not a
    slot of this version, a slot still torn after retries, or one whose process is gone. The
    extension region (bytes 256..511) comes with it when its own counter read consistent too,
    else as ``b""``: another subsystem's writes never keep a rank from being read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        whole: bytes | None = None  # hang detection's part consistent, the extension's not (yet)
        for _ in range(_READ_TRIES):
            raw = os.pread(fd, SLOT_SIZE, 0)
            if len(raw) < SLOT_SIZE:
                return None
            (seq,) = SEQ.unpack_from(raw, 0)
            (ext,) = SEQ.unpack_from(raw, EXTENSION_AT)
            (after,) = SEQ.unpack(os.pread(fd, 8, 0))
            (ext_after,) = SEQ.unpack(os.pread(fd, 8, EXTENSION_AT))
            if seq % 2 == 0 and seq == after:
                if ext % 2 == 0 and ext == ext_after:
                    return _decode(Path(path), raw, raw[EXTENSION_AT:])
                whole = raw
            time.sleep(0)
        return _decode(Path(path), whole, b"") if whole is not None else None
    finally:
        os.close(fd)


def _decode(path: Path, raw: bytes, extension: bytes) -> BeaconSlot | None:
    magic, version, phase, signum, pid, rank, proc_start, start_ns = HEADER.unpack_from(raw, HEADER_AT)
    if magic != MAGIC or version != VERSION or not alive(pid, proc_start):
        return None
    reports, steps, last, ident, phase_since = PROGRESS.unpack_from(raw, PROGRESS_AT)
    try:
        phase_value = Phase(phase)
    except ValueError:
        return None
    buckets = (BUCKET.unpack_from(raw, CADENCE_AT + BUCKET.size * i) for i in range(CADENCE_BUCKETS))
    return BeaconSlot(
        path=path, pid=pid, rank=rank, phase=phase_value, dump_signal=signum, start_ns=start_ns,
        reports=reports, steps=steps, last_progress_ns=last, thread_ident=ident, phase_since_ns=phase_since,
        slow_intervals=tuple(sorted((i, v) for i, v in buckets if v)), extension=extension,
        proc_start=proc_start,
    )  # fmt: skip


def read_slots(directory: Path) -> list[BeaconSlot]:
    """Every live rank's slot under ``directory``, by rank; slots of dead processes, other
    versions and files that are not slots are skipped. Needs nothing from the ranks' processes."""
    try:
        paths = sorted(Path(directory).glob(f"*{SUFFIX}"))
    except OSError:
        return []
    slots = [slot for slot in map(read_slot, paths) if slot is not None]
    return sorted(slots, key=lambda s: (s.rank, s.pid))
