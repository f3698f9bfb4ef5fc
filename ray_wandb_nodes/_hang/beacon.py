"""The progress beacon: one small shared-memory file per rank that the rank stamps on every
report, optimizer step and phase change, and that the node's logger reads from outside.

The rank mmaps its slot and writes it with ``struct.pack_into`` (no syscall, no lock, no thread);
a reader reads it with ``pread`` (a file read: it needs nothing from the rank's process, so a
rank whose Python cannot run is read like any other). A sequence counter (a seqlock: odd while a
write is under way) lets the reader retry instead of seeing a torn write.

Times are ``CLOCK_MONOTONIC`` nanoseconds, which only mean something on the host that took them:
the reader compares them with its own monotonic clock on the same node, and only ages (seconds
since progress) leave the node (:func:`progress_of`).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = 0x52574E42  # "RWNB"
VERSION = 1
SLOT_SIZE = 128
SUFFIX = ".slot"

_SEQ = struct.Struct("<Q")  # offset 0
_HEADER = struct.Struct("<IHBBiiQQ")  # offset 8: magic, version, phase, dump signal, pid, rank, proc start, start ns
_PROGRESS = struct.Struct(
    "<QQQQQQ"
)  # offset 40: reports, steps, last progress ns, max interval ns, thread, phase since
_STEP = struct.Struct("<QQQQ")  # offset 48: steps, last progress ns, max interval ns, thread
_HEADER_AT, _PROGRESS_AT, _STEP_AT = 8, 40, 48
_READ_TRIES = 50


class Phase(enum.IntEnum):
    """What a rank is doing between two stamps; a long phase is allowed longer (see ``policy``)."""

    RUNNING = 0
    CHECKPOINTING = 1
    EVALUATING = 2
    IN_REPORT = 3  # inside ``ray.train.report`` (Ray's report barrier)
    STARTING = 4  # armed, its train function not started yet (Ray's worker group start): not judged


LONG_PHASES = frozenset({Phase.CHECKPOINTING, Phase.EVALUATING})  # allowed longer than a step


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
    max_interval_ns: int  # the slowest interval between two progress stamps, phases excluded
    thread_ident: int  # ``threading.get_ident()`` of the thread that last stamped progress
    phase_since_ns: int
    proc_start: int = 0  # the process's start time (``/proc/<pid>/stat``): tells it from a later one with its pid

    @property
    def started(self) -> bool:
        """Whether the rank has made any progress (a report or an optimizer step) yet."""
        return self.last_progress_ns > 0


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
    slowest_interval_s: float | None  # None until two progress stamps were seen
    dump_signal: int
    proc_start: int = 0  # its process's start time: an end names the process by it (see ``RankProcess``)


def progress_of(slot: BeaconSlot, now_ns: int) -> RankProgress:
    """Ages of ``slot`` against ``now_ns``, a monotonic time taken on the slot's own host."""
    since = slot.last_progress_ns if slot.started else slot.start_ns
    return RankProgress(
        rank=slot.rank,
        pid=slot.pid,
        reports=slot.reports,
        steps=slot.steps,
        started=slot.started,
        age_s=max(0.0, (now_ns - since) / 1e9),
        phase=slot.phase,
        phase_age_s=max(0.0, (now_ns - slot.phase_since_ns) / 1e9),
        slowest_interval_s=slot.max_interval_ns / 1e9 if slot.max_interval_ns else None,
        dump_signal=slot.dump_signal,
        proc_start=slot.proc_start,
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
    (``bench/beacon_cost.py``): a monotonic clock read and three ``pack_into`` on the mmap."""

    def __init__(self, directory: Path, rank: int, phase: Phase = Phase.RUNNING) -> None:
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
        self._reports = self._steps = self._last = self._max = 0
        self._count_next = False  # the first interval (start to first progress) is not a cadence
        self._phase = Phase(phase)
        self._signal = 0
        self._start = self._phase_since = time.monotonic_ns()
        self._proc_start = _proc_start(self.pid)
        # Bound once: the hot path looks up no attribute chain.
        self._pack_seq = _SEQ.pack_into
        self._pack_step = _STEP.pack_into
        self._now = time.monotonic_ns
        self._ident = threading.get_ident
        self._last_ident = self._ident()  # the thread that stamped progress last (the training thread)
        self._write_all(self._last_ident)

    def step(self, *_args: Any) -> None:
        """One optimizer step (the signature takes the hook's arguments and ignores them)."""
        now = self._now()
        self._steps += 1
        if self._count_next and now - self._last > self._max:
            self._max = now - self._last
        self._count_next = True
        self._last = now
        self._last_ident = ident = self._ident()
        seq = self._seq + 1
        m = self._map
        self._pack_seq(m, 0, seq)
        self._pack_step(m, _STEP_AT, self._steps, now, self._max, ident)
        self._seq = seq + 1
        self._pack_seq(m, 0, seq + 1)

    def report(self) -> None:
        """One ``ray.train.report`` returned (or a framework's report the plugin sees)."""
        now = self._now()
        self._reports += 1
        if self._count_next and now - self._last > self._max:
            self._max = now - self._last
        self._count_next = True
        self._last = now
        self._last_ident = self._ident()
        self._write_all(self._last_ident)

    def phase(self, phase: Phase) -> None:
        """Enter ``phase``; the stamp counts as progress, and the interval that spans a long phase
        is left out of the slowest cadence (the policy allows phases their own limit).

        Before the rank's first progress, entering or leaving a long phase is not progress: the
        time before the first progress counts again from the stamp, so that an evaluation before
        the first step (Lightning's sanity check) leaves the first step the first step's limit."""
        now = self._now()
        phase = Phase(phase)
        if self._last == 0 and (phase in LONG_PHASES or self._phase in LONG_PHASES):
            self._start = now
        else:
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

    def _write_all(self, ident: int) -> None:
        seq = self._seq + 1
        m = self._map
        self._pack_seq(m, 0, seq)
        _HEADER.pack_into(
            m, _HEADER_AT, MAGIC, VERSION, int(self._phase), self._signal, self.pid, self.rank,
            self._proc_start, self._start,
        )  # fmt: skip
        _PROGRESS.pack_into(
            m, _PROGRESS_AT, self._reports, self._steps, self._last, self._max, ident, self._phase_since
        )
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
    slot of this version, a slot still torn after retries, or one whose process is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        for _ in range(_READ_TRIES):
            before = os.pread(fd, SLOT_SIZE, 0)
            if len(before) < SLOT_SIZE:
                return None
            (seq,) = _SEQ.unpack_from(before, 0)
            (after,) = _SEQ.unpack(os.pread(fd, 8, 0))
            if seq % 2 == 0 and seq == after:
                return _decode(Path(path), before)
            time.sleep(0)
        return None
    finally:
        os.close(fd)


def _decode(path: Path, raw: bytes) -> BeaconSlot | None:
    magic, version, phase, signum, pid, rank, proc_start, start_ns = _HEADER.unpack_from(raw, _HEADER_AT)
    if magic != MAGIC or version != VERSION or not _alive(pid, proc_start):
        return None
    reports, steps, last, max_iv, ident, phase_since = _PROGRESS.unpack_from(raw, _PROGRESS_AT)
    try:
        phase_value = Phase(phase)
    except ValueError:
        return None
    return BeaconSlot(
        path=path, pid=pid, rank=rank, phase=phase_value, dump_signal=signum, start_ns=start_ns,
        reports=reports, steps=steps, last_progress_ns=last, max_interval_ns=max_iv,
        thread_ident=ident, phase_since_ns=phase_since, proc_start=proc_start,
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
