"""The progress beacon: the rank's writer of its slot (``slot``), stamped on every report,
optimizer step and phase change, and read by the node's logger from outside.

The rank mmaps its slot and writes it with ``struct.pack_into`` (no syscall, no lock, no thread):
see :class:`Beacon` for what it costs and for the cadence it keeps. The slot's layout and its
readers are ``slot``'s; their names are exported here as well.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .slot import (
    BUCKET,
    CADENCE_AT,
    CADENCE_BUCKET_NS,
    CADENCE_BUCKETS,
    EXTENSION_AT,
    HEADER,
    HEADER_AT,
    LONG_PHASES,
    MAGIC,
    PROGRESS,
    PROGRESS_AT,
    SEQ,
    SLOT_SIZE,
    STEP,
    STEP_AT,
    SUFFIX,
    VERSION,
    BeaconSlot,
    Phase,
    RankProgress,
    process_start,
    progress_of,
    read_slot,
    read_slots,
    recent_slowest_ns,
    slot_path,
)

__all__ = [
    "CADENCE_BUCKETS",
    "CADENCE_BUCKET_NS",
    "EXTENSION_AT",
    "LONG_PHASES",
    "MAGIC",
    "SLOT_SIZE",
    "SUFFIX",
    "VERSION",
    "Beacon",
    "BeaconSlot",
    "Phase",
    "RankProgress",
    "default_root",
    "install_step_hook",
    "progress_of",
    "read_slot",
    "read_slots",
    "recent_slowest_ns",
    "slot_path",
]


def default_root() -> Path:
    """Where beacons live on this host: ``/dev/shm`` (memory, never the disk) where it exists and
    is writable, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


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
        self._pack_seq = SEQ.pack_into
        self._pack_step = STEP.pack_into
        self._ident = threading.get_ident
        self._start = self._phase_since = clock()
        self._proc_start = process_start(self.pid)
        self._created_ident = self._ident()
        # The thread that stamped progress last (the training thread); 0 until one has: the thread
        # that arms a rank is Ray's worker thread, not Train's TrainingThread, which the evidence
        # then finds by its name.
        self._last_ident = 0
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
        self._pack_step(m, STEP_AT, self._steps, now, ident)
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
        the thread that stamped progress or a phase last, or any thread while no thread has stamped
        one yet or the last stamp is the creating thread's (before the train function's first)."""
        last = self._last_ident
        return last in (0, self._created_ident) or last == self._ident()

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
        BUCKET.pack_into(m, CADENCE_AT + BUCKET.size * (self._bucket % CADENCE_BUCKETS), self._bucket, interval)
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
        HEADER.pack_into(
            m, HEADER_AT, MAGIC, VERSION, int(self._phase), self._signal, self.pid, self.rank,
            self._proc_start, self._start,
        )  # fmt: skip
        PROGRESS.pack_into(m, PROGRESS_AT, self._reports, self._steps, self._last, ident, self._phase_since)
        self._seq = seq + 1
        self._pack_seq(m, 0, seq + 1)


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
