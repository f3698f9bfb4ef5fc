"""The progress beacon: one small shared-memory file per rank that the rank stamps on every
report, optimizer step and phase change, and that the node's logger reads from outside.

The rank mmaps its slot and writes it with ``struct.pack_into`` (no syscall, no lock, no thread);
a reader reads it with ``pread`` (a file read: it needs nothing from the rank's process, so a
rank whose Python cannot run is read like any other). A sequence counter (a seqlock: odd while a
write is under way) lets the reader retry instead of seeing a torn write.

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
        bucket ``i`` at ``80 + 16 * (i % CADENCE_BUCKETS)``; see :class:`Beacon`
176     free, hang detection's
256     RESERVED for another subsystem of the rank (the per-rank step anatomy): its own
        sequence counter (u64) at 256, odd while its writer writes, and its data at 264-511.
        Hang detection never writes there; :attr:`Beacon.extension` gives a writer the
        region, and :func:`read_slot` hands it back raw as :attr:`BeaconSlot.extension`,
        read only when both counters read the same, even, before and after.
======  =====================================================================================
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = 0x52574E42  # "RWNB"
VERSION = 2
SLOT_SIZE = 512
EXTENSION_AT = 256  # bytes 256..511: another subsystem's (its own seqlock at 256), never hang detection's
SUFFIX = ".slot"
# The cadence's window: the slowest interval of each bucket of ten minutes, the last six buckets
# (the current one and five before: 50 to 60 minutes). Why: ``policy``'s module docstring.
CADENCE_BUCKET_NS = 600 * 10**9
CADENCE_BUCKETS = 6

_SEQ = struct.Struct("<Q")  # offset 0 (hang detection's) and EXTENSION_AT (the extension's)
_HEADER = struct.Struct("<IHBBiiQQ")  # offset 8: magic, version, phase, dump signal, pid, rank, proc start, start ns
_PROGRESS = struct.Struct("<QQQQQ")  # offset 40: reports, steps, last progress ns, thread, phase since
_STEP = struct.Struct("<QQQ")  # offset 48: steps, last progress ns, thread
_BUCKET = struct.Struct("<QQ")  # bucket index, slowest interval ns of the bucket
_HEADER_AT, _PROGRESS_AT, _STEP_AT, _CADENCE_AT = 8, 40, 48, 80
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
    )


def default_root() -> Path:
    """Where beacons live on this host: ``/dev/shm`` (memory, never the disk) where it exists and
    is writable, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


def slot_path(directory: Path, rank: int, pid: int) -> Path:
    """The slot file of ``rank`` in process ``pid``; the other per-rank files share its stem."""
    return Path(directory) / f"rank-{rank}.{pid}{SUFFIX}"


def _proc_start(pid: int) -> int:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22), 0 where unknown:
    tells a live process from a later one that reuses a dead rank's pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text.rsplit(")", 1)[1].split()[19])


class Beacon:
    """A rank's writer. ``step()``, ``report()`` and ``phase()`` cost well under 2 us each
    (``bench/beacon_cost.py``): a monotonic clock read and three ``pack_into`` on the mmap.

    **The cadence** that ``hang_timeout_s="auto"`` follows: an interval between progress runs
    from a step or a report to the next step, report or phase change (the work before a save, an
    evaluation or Ray's report barrier counts; the time inside those, and the first interval
    after one or after the train function's start, do not: they have limits of their own). Each
    interval raises the slowest interval of its ten-minute bucket, and the slot keeps the last
    :data:`CADENCE_BUCKETS` buckets: the reader takes the slowest still in the window
    (:meth:`BeaconSlot.slowest_recent_ns`), so a slow interval is forgotten an hour after it.
    An interval longer than ``hang_limit_s`` gives for the rank's own recent cadence (the
    running limit in force, policy's) was a hang, judged or not: it is left out. The hot path
    pays one comparison for it; a bucket is written only when its slowest interval grows.

    ``clock`` is the monotonic clock in nanoseconds (the readers compare with
    ``time.monotonic_ns`` on the same host; tests give a controlled one)."""

    def __init__(
        self,
        directory: Path,
        rank: int,
        phase: Phase = Phase.RUNNING,
        *,
        hang_limit_s: Callable[[float | None], float] | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an int >= 0, got {rank!r}")
        self.directory = Path(directory)
        self.rank = rank
        self.pid = os.getpid()
        self.path = slot_path(self.directory, rank, self.pid)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOT_SIZE)
            self._map = mmap.mmap(fd, SLOT_SIZE)
        finally:
            os.close(fd)  # the mapping keeps the file
        self._seq = 0
        self._reports = self._steps = self._last = 0
        self._count_next = False  # the first interval (start to first progress) is not a cadence
        self._phase = Phase(phase)
        self._signal = 0
        self._hang_limit_s = hang_limit_s
        # The cadence's current bucket: its index, where it ends, its slowest interval; the
        # buckets written (index, slowest), at most CADENCE_BUCKETS, for the rank's own limit.
        self._bucket = self._bucket_end = self._bucket_slowest = 0
        self._buckets: dict[int, int] = {}
        # Bound once: the hot path looks up no attribute chain.
        self._now = clock
        self._pack_seq = _SEQ.pack_into
        self._pack_step = _STEP.pack_into
        self._ident = threading.get_ident
        self._start = self._phase_since = clock()
        self._proc_start = _proc_start(self.pid)
        self._last_ident = self._created_ident = self._ident()  # the thread that stamped progress last
        self._write_all(self._last_ident)

    def step(self, *_args: Any) -> None:
        """One optimizer step (the signature takes the hook's arguments and ignores them)."""
        now = self._now()
        self._steps += 1
        if self._count_next and (now - self._last > self._bucket_slowest or now >= self._bucket_end):
            self._interval(now)  # rare: the slowest of its bucket so far, or a new bucket
        self._count_next = True
        self._last = now
        self._last_ident = ident = self._ident()
        seq = self._seq + 1
        m = self._map
        self._pack_seq(m, 0, seq)
        self._pack_step(m, _STEP_AT, self._steps, now, ident)
        self._seq = seq + 1
        self._pack_seq(m, 0, seq + 1)

    def report(self) -> None:
        """One ``ray.train.report`` returned (or a framework's report the plugin sees)."""
        now = self._now()
        self._reports += 1
        if self._count_next and (now - self._last > self._bucket_slowest or now >= self._bucket_end):
            self._interval(now)
        self._count_next = True
        self._last = now
        self._last_ident = self._ident()
        self._write_all(self._last_ident)

    def phase(self, phase: Phase) -> None:
        """Enter ``phase``. Once the rank has made progress, the stamp counts as progress, the
        work before it is an interval of the cadence, and the time inside the phase (and up to
        the next step or report) is not (the policy allows phases their own limit).

        Before the rank's first progress no phase change is progress: the rank keeps the first
        step's limit. Entering or leaving a long phase then counts the time before the first
        progress again from the stamp, so that an evaluation before the first step (Lightning's
        sanity check) leaves the first step the first step's limit; Ray's report phase leaves
        that time as it is (a report entered before any step is no step)."""
        now = self._now()
        if type(phase) is not Phase:
            phase = Phase(phase)  # an int (Phase's call costs more than the rest of this method)
        if self._last == 0:
            if phase in LONG_PHASES or self._phase in LONG_PHASES:
                self._start = now
        else:
            if self._count_next:
                self._interval(now)
            self._last = now
        self._phase = phase
        self._phase_since = now
        self._count_next = False
        self._last_ident = self._ident()
        self._write_all(self._last_ident)

    @contextlib.contextmanager
    def in_phase(self, phase: Phase) -> Iterator[None]:
        """``with beacon.in_phase(Phase.CHECKPOINTING): save()``: the phase, then running again."""
        self.phase(phase)
        try:
            yield
        finally:
            self.phase(Phase.RUNNING)

    def start_clock(self) -> None:
        """The train function starts now: running, and the time before a first progress counts
        from here (not from the worker's creation, which Ray's set-up of the group follows)."""
        self._start = self._phase_since = self._now()
        self._phase = Phase.RUNNING
        self._write_all(self._last_ident)  # no progress: the thread of the last progress stays

    @property
    def current_phase(self) -> Phase:
        return self._phase

    def on_training_thread(self) -> bool:
        """Whether the calling thread is the rank's training thread as far as the beacon knows:
        the thread that stamped progress or a phase last, or any thread while the last stamp is
        still the one of the thread that created the beacon (before the train function's first)."""
        last = self._last_ident
        return last == self._created_ident or last == self._ident()

    @property
    def extension(self) -> memoryview:
        """Bytes 256..511 of the slot, for another subsystem's writer in this process (hang
        detection never writes there). Its first 8 bytes are that writer's own sequence counter,
        odd while it writes (:func:`read_slot` returns the region only when it reads even and the
        same before and after). Release the view before :meth:`close`."""
        return memoryview(self._map)[EXTENSION_AT:SLOT_SIZE]

    def set_dump_signal(self, signum: int) -> None:
        """Record that faulthandler is registered on ``signum`` (0: not registered)."""
        self._signal = signum
        self._write_all(self._last_ident)

    def close(self, remove: bool = True) -> None:
        """Unmap the slot and, by default, remove its file (a reader then no longer lists it)."""
        with contextlib.suppress(ValueError, BufferError):
            self._map.close()
        if remove:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _interval(self, now: int) -> None:
        """The interval that ends ``now`` (it began at the last step or report): the slowest of
        its bucket unless a slower one came before it in the bucket or it was a hang."""
        if now >= self._bucket_end:
            self._bucket = now // CADENCE_BUCKET_NS
            self._bucket_end = (self._bucket + 1) * CADENCE_BUCKET_NS
            self._bucket_slowest = 0
        interval = now - self._last
        if interval <= self._bucket_slowest or interval > self._limit_ns(now):
            return
        self._bucket_slowest = interval
        oldest = self._bucket - CADENCE_BUCKETS + 1
        self._buckets = {i: v for i, v in self._buckets.items() if i >= oldest}
        self._buckets[self._bucket] = interval
        seq = self._seq + 1
        m = self._map
        self._pack_seq(m, 0, seq)
        _BUCKET.pack_into(m, _CADENCE_AT + _BUCKET.size * (self._bucket % CADENCE_BUCKETS), self._bucket, interval)
        self._seq = seq + 1
        self._pack_seq(m, 0, seq + 1)

    def _limit_ns(self, now: int) -> float:
        """The running limit in force for this rank's recent cadence; an interval past it was a hang."""
        if self._hang_limit_s is None:
            return float("inf")
        slowest = recent_slowest_ns(self._buckets.items(), now)
        return self._hang_limit_s(slowest / 1e9 if slowest else None) * 1e9

    def _write_all(self, ident: int) -> None:
        seq = self._seq + 1
        m = self._map
        self._pack_seq(m, 0, seq)
        _HEADER.pack_into(
            m, _HEADER_AT, MAGIC, VERSION, int(self._phase), self._signal, self.pid, self.rank,
            self._proc_start, self._start,
        )  # fmt: skip
        _PROGRESS.pack_into(m, _PROGRESS_AT, self._reports, self._steps, self._last, ident, self._phase_since)
        self._seq = seq + 1
        self._pack_seq(m, 0, seq + 1)


def _alive(pid: int, proc_start: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return proc_start == 0 or _proc_start(pid) in (0, proc_start)


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
            (seq,) = _SEQ.unpack_from(raw, 0)
            (ext,) = _SEQ.unpack_from(raw, EXTENSION_AT)
            (after,) = _SEQ.unpack(os.pread(fd, 8, 0))
            (ext_after,) = _SEQ.unpack(os.pread(fd, 8, EXTENSION_AT))
            if seq % 2 == 0 and seq == after:
                if ext % 2 == 0 and ext == ext_after:
                    return _decode(Path(path), raw, raw[EXTENSION_AT:])
                whole = raw
            time.sleep(0)
        return _decode(Path(path), whole, b"") if whole is not None else None
    finally:
        os.close(fd)


def _decode(path: Path, raw: bytes, extension: bytes) -> BeaconSlot | None:
    magic, version, phase, signum, pid, rank, proc_start, start_ns = _HEADER.unpack_from(raw, _HEADER_AT)
    if magic != MAGIC or version != VERSION or not _alive(pid, proc_start):
        return None
    reports, steps, last, ident, phase_since = _PROGRESS.unpack_from(raw, _PROGRESS_AT)
    try:
        phase_value = Phase(phase)
    except ValueError:
        return None
    buckets = (_BUCKET.unpack_from(raw, _CADENCE_AT + _BUCKET.size * i) for i in range(CADENCE_BUCKETS))
    return BeaconSlot(
        path=path, pid=pid, rank=rank, phase=phase_value, dump_signal=signum, start_ns=start_ns,
        reports=reports, steps=steps, last_progress_ns=last, thread_ident=ident, phase_since_ns=phase_since,
        slow_intervals=tuple(sorted((i, v) for i, v in buckets if v)), extension=extension,
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


def install_step_hook(beacon: Beacon) -> Callable[[], None] | None:
    """Stamp ``beacon`` after every optimizer step of the process (torch's global optimizer-step
    hook, any optimizer, no user code). Returns the function that removes the hook, or None
    where torch (or its global hook) is missing."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        return None
    handle = register_optimizer_step_post_hook(beacon.step)
    return handle.remove  # type: ignore[no-any-return]
