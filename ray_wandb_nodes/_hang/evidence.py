"""Evidence from a rank's process, taken out of band (files, a FIFO and a signal on the rank's
own node; never a torch collective, which is what hangs).

A rank calls :func:`arm` at its start. It registers ``faulthandler`` on a free user signal with
every thread (a C-level handler that writes every thread's Python stack without the GIL, so it
works while native code holds it) and records the signal in its beacon slot; it starts a small
dump thread that sleeps in a blocking read of a FIFO (no wake-up a step) and, when woken, writes
every thread's Python stack with names and the flight recorder's collectives.

The node's logger calls :func:`request_dumps` with the slots it read: it wakes each dump thread,
signals each process whose slot says it registered (the default action of SIGUSR1/SIGUSR2 ends
a process, so no other is signalled), and waits a bounded time for the files. A rank whose
Python cannot run yields the faulthandler dump only; one that can yields both.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import json
import os
import signal
import stat
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .beacon import SUFFIX, Beacon, BeaconSlot, slot_path
from .ending import END_REQUEST, raise_in_training_thread
from .flight import FlightRecord, dump_flight_recorder, parse_flight_recorder
from .stacks import ThreadStack, parse_faulthandler, python_stacks, stack_from_data, stack_to_data, training_first

# SIGUSR2 first: Tune's driver claims SIGUSR1 (ray/tune/tune.py), Ray's dashboard agent SIGUSR2
# in its own process only. In a Ray 2.60 actor both are at their default, neither caught in C
# (/proc/self/status SigCgt) nor blocked (checked on a local ray.init).
CANDIDATE_SIGNALS = tuple(getattr(signal, n) for n in ("SIGUSR2", "SIGUSR1") if hasattr(signal, n))
DUMP_THREAD_NAME = "ray_wandb_nodes-hang-dump"
_REQUEST = struct.Struct("<Q")
_POLL_S = 0.02
_STABLE_POLLS = 3  # faulthandler writes in pieces: a size that stays put this many polls is a whole dump
_armed: dict[int, Armed] = {}  # by rank: the open stacks file must outlive the registration
_request_ids = itertools.count(int(time.time() * 1000) % 1_000_000_000 * 1000)


@dataclass(frozen=True)
class EvidencePaths:
    """The per-rank files beside the rank's beacon slot (same stem)."""

    stacks: Path  # faulthandler's text, appended at each signal
    request: Path  # the FIFO that wakes the dump thread
    python: Path  # the dump thread's JSON (named Python stacks and the flight recorder)
    end: Path  # an end request's JSON: the training thread to raise in, and the message
    ack: Path  # the id of the request the dump thread is answering (its Python runs: never signal it)

    @classmethod
    def of(cls, directory: Path, rank: int, pid: int) -> EvidencePaths:
        slot = slot_path(directory, rank, pid)
        stem = slot.name[: -len(SUFFIX)]  # "rank-3.1234": the pid is part of the stem
        ends = (".stacks", ".req", ".evidence.json", ".end.json", ".ack")
        return cls(*(slot.with_name(stem + end) for end in ends))


@dataclass
class Armed:
    """What :func:`arm` set up in this process (:func:`disarm` undoes it)."""

    rank: int
    signum: int  # 0: no free signal, no faulthandler dump
    paths: EvidencePaths
    stacks_file: IO[bytes] | None
    thread: threading.Thread | None
    stop: threading.Event = field(default_factory=threading.Event)
    listening: threading.Event = field(default_factory=threading.Event)  # the dump thread has its FIFO open


@dataclass(frozen=True)
class RankEvidence:
    """What one rank's process gave when asked."""

    rank: int
    pid: int
    training_ident: int  # the thread that stamped its beacon last (0: unknown)
    native: tuple[ThreadStack, ...] = ()  # faulthandler's dump (Python stacks read without the GIL)
    python: tuple[ThreadStack, ...] = ()  # the dump thread's stacks, with thread names
    flight: FlightRecord | None = None
    notes: tuple[str, ...] = ()  # what could not be taken, and why

    @property
    def stacks(self) -> tuple[ThreadStack, ...]:
        """The best stacks there are: named ones where Python could run, else faulthandler's."""
        return self.python or self.native

    def threads(self) -> list[ThreadStack]:
        """:attr:`stacks` with the training thread first (for the run's stack file)."""
        return training_first(self.stacks, self.training_ident)


def free_signal() -> int:
    """The first of SIGUSR2, SIGUSR1 still at its default action here; 0 where none is."""
    for signum in CANDIDATE_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            return int(signum)
    return 0


def arm(dump_dir: Path, rank: int, beacon: Beacon | None = None, signum: int | None = None) -> Armed:
    """Arm this process for evidence: faulthandler on a free signal writing every thread into a
    per-rank file, and the dump thread on its FIFO. Records the signal in ``beacon``'s slot (the
    node signals no process that did not). Arming twice for one rank returns the first."""
    if rank in _armed:
        return _armed[rank]
    paths = EvidencePaths.of(Path(dump_dir), rank, os.getpid())
    Path(dump_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    chosen = free_signal() if signum is None else signum
    stacks_file: IO[bytes] | None = None
    if chosen:
        try:
            stacks_file = open(paths.stacks, "ab", buffering=0)  # kept open while registered
            faulthandler.register(chosen, file=stacks_file, all_threads=True, chain=False)
        except (RuntimeError, ValueError, OSError):
            if stacks_file is not None:
                stacks_file.close()
            stacks_file, chosen = None, 0
    armed = Armed(rank, chosen, paths, stacks_file, None)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(paths.request, 0o600)
    except OSError:
        pass  # a file system without FIFOs: faulthandler's dump only
    else:
        armed.thread = threading.Thread(target=_dump_loop, args=(armed,), name=DUMP_THREAD_NAME, daemon=True)
        armed.thread.start()
        armed.listening.wait(timeout=1.0)  # so that a request right after arm() finds a reader
    if beacon is not None and chosen:
        beacon.set_dump_signal(chosen)
    _armed[rank] = armed
    return armed


def disarm(armed: Armed, beacon: Beacon | None = None) -> None:
    """Undo :func:`arm`: unregister the signal, stop the dump thread, remove the FIFO."""
    _armed.pop(armed.rank, None)
    if armed.signum:
        faulthandler.unregister(armed.signum)
        if beacon is not None:
            beacon.set_dump_signal(0)
    armed.stop.set()
    with contextlib.suppress(OSError):
        _wake(armed.paths.request, 0)
    if armed.thread is not None:
        armed.thread.join(timeout=2)
    if armed.stacks_file is not None:
        armed.stacks_file.close()
    with contextlib.suppress(OSError):
        armed.paths.request.unlink()


def _dump_loop(armed: Armed) -> None:
    # O_RDWR: the FIFO always has a writer (this thread), so reads block instead of seeing EOF.
    try:
        fd = os.open(armed.paths.request, os.O_RDWR)
    except OSError:
        return
    armed.listening.set()
    try:
        while not armed.stop.is_set():
            data = os.read(fd, 4096)  # blocks without the GIL; woken only by a request
            if armed.stop.is_set():
                return
            ids = [_REQUEST.unpack_from(data, i)[0] for i in range(0, len(data) - len(data) % 8, 8)]
            if END_REQUEST in ids:
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    raise_in_training_thread(armed.paths.end)
                ids = [i for i in ids if i != END_REQUEST]
            if ids:
                with contextlib.suppress(OSError, ValueError, TypeError):  # a failed dump is no evidence
                    armed.paths.ack.write_text(str(max(ids)))  # Python runs here: the node will not signal
                    _write_python_evidence(armed.paths.python, max(ids))
    except OSError:
        return
    finally:
        os.close(fd)


def _write_python_evidence(path: Path, request_id: int) -> None:
    stacks = python_stacks(exclude=[threading.get_ident()])
    data: dict[str, Any] = {
        "request": request_id,
        "threads": [stack_to_data(s) for s in stacks],
        "flight_recorder": dump_flight_recorder(),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a reader sees the old file or the whole new one


def request_end(slot: BeaconSlot, message: str) -> bool:
    """Ask ``slot``'s rank to raise :class:`HangError` with ``message`` in its training thread
    (the thread that stamped its beacon last); False where its dump thread cannot be reached
    (its Python cannot run, or it is not armed): the caller ends the process instead."""
    paths = EvidencePaths.of(slot.path.parent, slot.rank, slot.pid)
    if not slot.started or not slot.thread_ident or not _is_fifo(paths.request):
        return False  # before any progress, the last stamp was the arming thread's, not training's
    try:
        tmp = paths.end.with_name(paths.end.name + ".tmp")
        tmp.write_text(json.dumps({"ident": slot.thread_ident, "message": message}))
        os.replace(tmp, paths.end)
        _wake(paths.request, END_REQUEST)
    except OSError:
        return False
    return True


def _wake(fifo: Path, request_id: int) -> None:
    """Write a request into the rank's FIFO without blocking (ENXIO: nobody reads it)."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, _REQUEST.pack(request_id))
    finally:
        os.close(fd)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


@dataclass
class _Pending:
    slot: BeaconSlot
    paths: EvidencePaths
    request_id: int
    offset: int
    notes: list[str]
    signalled: bool = False
    woken: bool = False
    native_text: str | None = None
    last_size: int = -1
    stable: int = 0
    python_data: dict[str, Any] | None = None

    def done(self) -> bool:
        """Whether all there is to take was taken: the Python-level dump, else faulthandler's."""
        if self.python_data is not None:
            return True
        if self.signalled:
            return self.native_text is not None
        return not self.woken


def request_dumps(slots: Iterable[BeaconSlot], timeout_s: float = 3.0, grace_s: float = 1.0) -> list[RankEvidence]:
    """Every rank's evidence at once, in two rounds. First every rank's dump thread is woken and
    the Python-level dumps (named stacks, the flight recorder) waited for together, at most
    ``grace_s``. Then only the ranks that gave none (their Python cannot run: native code holds
    the GIL) are signalled for faulthandler's dump, waited for until ``timeout_s`` in all.

    faulthandler walks every thread's frames from a signal handler without the GIL: with another
    thread of the process running Python meanwhile (the dump thread answering, say) that walk can
    crash the process (a SIGSEGV in ``PyCode_Addr2Line`` was seen on a live rank). A process
    whose Python cannot run has no thread changing its frames; one whose Python can answered the
    first round. Only a process whose slot records a registered signal is signalled; a rank that
    gave nothing says why in ``notes``."""
    started = time.monotonic()
    pending = []
    for slot in slots:
        paths = EvidencePaths.of(slot.path.parent, slot.rank, slot.pid)
        item = _Pending(slot, paths, next(_request_ids), _size(paths.stacks), [])
        if _is_fifo(paths.request):
            try:
                _wake(paths.request, item.request_id)
                item.woken = True
            except OSError as err:
                item.notes.append(f"dump thread not reachable: {err.strerror or err}")
        else:
            item.notes.append("no dump thread (not armed)")
        pending.append(item)
    _wait(pending, started + min(grace_s, timeout_s))
    for item in pending:
        if item.python_data is not None or _acked(item):
            continue  # answered, or answering: its Python runs
        if not item.slot.dump_signal:
            item.notes.append("faulthandler not registered: not signalled")
            continue
        try:
            os.kill(item.slot.pid, item.slot.dump_signal)
            item.signalled = True
        except OSError as err:
            item.notes.append(f"could not signal pid {item.slot.pid}: {err.strerror or err}")
    _wait(pending, started + timeout_s)
    return [_evidence(item) for item in pending]


def _acked(item: _Pending) -> bool:
    try:
        return int(item.paths.ack.read_text() or 0) == item.request_id
    except (OSError, ValueError):
        return False


def _wait(pending: list[_Pending], deadline: float) -> None:
    while True:
        for item in pending:
            _poll(item)
        if all(item.done() for item in pending) or time.monotonic() >= deadline:
            return
        time.sleep(_POLL_S)


def request_dump(slot: BeaconSlot, timeout_s: float = 3.0) -> RankEvidence:
    """One rank's evidence (see :func:`request_dumps`)."""
    return request_dumps([slot], timeout_s)[0]


def _poll(item: _Pending) -> None:
    if item.signalled and item.native_text is None:
        size = _size(item.paths.stacks)
        if size > item.offset and size == item.last_size:
            item.stable += 1
            if item.stable >= _STABLE_POLLS:
                with open(item.paths.stacks, "rb") as f:
                    f.seek(item.offset)
                    item.native_text = f.read(size - item.offset).decode(errors="replace")
        else:
            item.stable = 0
        item.last_size = size
    if item.woken and item.python_data is None:
        try:
            data = json.loads(item.paths.python.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("request") == item.request_id:
            item.python_data = data


def _evidence(item: _Pending) -> RankEvidence:
    notes = list(item.notes)
    if item.signalled and not parse_faulthandler(item.native_text or ""):
        notes.append("no faulthandler dump within the wait")
    if item.woken and item.python_data is None:
        notes.append("no Python-level dump within the wait (Python could not run, or the process is busy)")
    return evidence_from_dumps(
        item.slot.rank, item.slot.pid, item.slot.thread_ident, item.native_text, item.python_data, notes
    )


def evidence_from_dumps(
    rank: int,
    pid: int,
    training_ident: int,
    faulthandler_text: str | None,
    dump_thread: dict[str, Any] | None,
    notes: Iterable[str] = (),
) -> RankEvidence:
    """A rank's evidence from what its dumps hold: faulthandler's text (its last dump is used)
    and the dump thread's JSON (named stacks and the flight recorder's text, trimmed to what the
    verdict reads: see ``FlightRecord.trimmed``)."""
    notes = list(notes)
    dumps = parse_faulthandler(faulthandler_text or "")
    python: tuple[ThreadStack, ...] = ()
    flight = None
    if dump_thread is not None:
        python = tuple(stack_from_data(s) for s in dump_thread.get("threads", []))
        text = dump_thread.get("flight_recorder")
        if text:
            try:
                flight = parse_flight_recorder(text).trimmed()  # what crosses to the driver
            except ValueError as err:
                notes.append(f"flight recorder: {err}")
    return RankEvidence(
        rank=rank,
        pid=pid,
        training_ident=training_ident,
        native=dumps[-1] if dumps else (),
        python=python,
        flight=flight,
        notes=tuple(notes),
    )
