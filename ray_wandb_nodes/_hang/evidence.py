"""Evidence from a rank's process, taken out of band (files, a FIFO and a signal on the rank's
own node; never a torch collective, which is what hangs).

A rank calls :func:`arm` at its start. It registers ``faulthandler`` on a free user signal with
every thread (a C-level handler that writes every thread's Python stack without the GIL, so it
works while native code holds it) and records the signal in its beacon slot; it starts a small
dump thread that sleeps in a select on a FIFO (no wake-up a step) and, when woken, writes
every thread's Python stack with names and the flight recorder's collectives.

The node's logger calls :func:`request_dumps` with the slots it read: it wakes each dump thread,
signals only a process whose Python provably cannot run and that still catches the signal it
registered (the default action of SIGUSR1/SIGUSR2 ends a process; ``dumps`` says what the proof
is), and waits a bounded time for the files. A rank whose Python cannot run yields the
faulthandler dump only; one that can yields the dump thread's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import os
import select
import signal
import struct
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from .beacon import SUFFIX, Beacon, slot_path
from .ending import END_REQUEST, raise_in_training_thread
from .flight import FlightRecord, dump_flight_recorder, trim_dump
from .stacks import TRAINING_THREAD_PREFIX, ThreadStack, python_stacks, stack_to_data, training_first

# SIGUSR2 first: Tune's driver claims SIGUSR1 (ray/tune/tune.py), Ray's dashboard agent SIGUSR2
# in its own process only. In a Ray 2.60 actor both are at their default, neither caught in C
# (/proc/self/status SigCgt) nor blocked (checked on a local ray.init).
CANDIDATE_SIGNALS = tuple(getattr(signal, n) for n in ("SIGUSR2", "SIGUSR1") if hasattr(signal, n))
DUMP_THREAD_NAME = "ray_wandb_nodes-hang-dump"
REQUEST = struct.Struct("<Q")
# The dump thread's file stays bounded: at most this many threads of at most this many frames
# (innermost first; faulthandler's own bound is 100 and 100).
MAX_THREADS, MAX_FRAMES = 256, 256
_armed: dict[int, Armed] = {}  # by rank: the open stacks file must outlive the registration


@dataclass(frozen=True)
class EvidencePaths:
    """The per-rank files beside the rank's beacon slot (same stem: the node removes them all once
    the process is dead, see ``folders``)."""

    stacks: Path  # faulthandler's text (the node empties it before each signal: one dump at most)
    request: Path  # the FIFO that wakes the dump thread
    python: Path  # the dump thread's JSON (named Python stacks and the flight recorder)
    end: Path  # an end request's JSON: the training thread to raise in, and the message
    ack: Path  # the id of the request the dump thread is answering (its Python runs: never signal it)
    thread: Path  # the dump thread's native thread id (the node reads its scheduling in /proc)

    @classmethod
    def of(cls, directory: Path, rank: int, pid: int) -> EvidencePaths:
        slot = slot_path(directory, rank, pid)
        stem = slot.name[: -len(SUFFIX)]  # "rank-3.1234": the pid is part of the stem
        ends = (".stacks", ".req", ".evidence.json", ".end.json", ".ack", ".thread")
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
    native_frames: str = ""  # ``py-spy dump --native`` of a rank whose Python could not run (``native``)

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
        wake(armed.paths.request, 0)
    if armed.thread is not None:
        armed.thread.join(timeout=2)
    if armed.stacks_file is not None:
        armed.stacks_file.close()
    for path in dataclasses.astuple(armed.paths):  # every file of the rank's process
        with contextlib.suppress(OSError):
            Path(path).unlink()


def _dump_loop(armed: Armed) -> None:
    # O_RDWR: the FIFO always has a writer (this thread), so it never reads as closed. The wait
    # is a select, without the GIL, that leaves the request in the FIFO: it is read only once
    # this thread runs Python, so a node that finds its request still there (``_withdraw``) knows
    # this thread has not begun to answer (a blocking read would take it while the GIL is held).
    try:
        fd = os.open(armed.paths.request, os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return
    with contextlib.suppress(OSError):  # without it, the node never signals this process
        armed.paths.thread.write_text(str(threading.get_native_id()))
    armed.listening.set()
    try:
        while not armed.stop.is_set():
            select.select([fd], [], [])  # woken only by a request
            if armed.stop.is_set():
                return
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                continue  # withdrawn by the node (it signals for faulthandler's dump instead)
            ids = [REQUEST.unpack_from(data, i)[0] for i in range(0, len(data) - len(data) % 8, 8)]
            if END_REQUEST in ids:
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    raise_in_training_thread(armed.paths.end)
                ids = [i for i in ids if i != END_REQUEST]
            if ids:
                try:
                    with contextlib.suppress(OSError, ValueError, TypeError):  # a failed dump is no evidence
                        armed.paths.ack.write_text(str(max(ids)))  # Python runs here: the node will not signal
                        _write_python_evidence(armed.paths.python, max(ids))
                finally:  # answered: its GIL waits from here on are a later request's
                    with contextlib.suppress(OSError):
                        armed.paths.ack.write_text(f"{max(ids)} done")
    except OSError:
        return
    finally:
        os.close(fd)


def _write_python_evidence(path: Path, request_id: int) -> None:
    """The named stacks at once (``"complete": false``), then again with the flight recorder's
    dump: that dump can take a second or more on a loaded node (its full ring, serialised), and
    a node that cannot wait for it still has the stacks. The file is bounded: the stacks
    (:func:`bounded`) and the recorder's collectives in flight and newest only (``trim_dump``),
    trimmed here, in the rank, before anything is written to the node's shared memory."""
    data: dict[str, Any] = {
        "request": request_id,
        "threads": [stack_to_data(s) for s in bounded(python_stacks(exclude=[threading.get_ident()]))],
        "flight_recorder": None,
        "complete": False,
    }
    _replace(path, data)
    flight = dump_flight_recorder()
    data.update(flight_recorder=trim_dump(flight) if flight else None, complete=True)
    _replace(path, data)


def bounded(stacks: list[ThreadStack]) -> list[ThreadStack]:
    """At most ``MAX_THREADS`` threads (Ray Train's training thread kept) of at most
    ``MAX_FRAMES`` frames each, the innermost (a cut stack says it is ``truncated``)."""
    if len(stacks) > MAX_THREADS:
        first = [s for s in stacks if s.name and s.name.startswith(TRAINING_THREAD_PREFIX)][:MAX_THREADS]
        stacks = first + [s for s in stacks if s not in first][: MAX_THREADS - len(first)]
    return [
        s if len(s.frames) <= MAX_FRAMES else replace(s, frames=s.frames[:MAX_FRAMES], truncated=True) for s in stacks
    ]


def _replace(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # a reader sees the old file or the whole new one


def wake(fifo: Path, request_id: int) -> None:
    """Write a request into the rank's FIFO without blocking (ENXIO: nobody reads it)."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, REQUEST.pack(request_id))
    finally:
        os.close(fd)
