"""The node's side of a hang's evidence: every rank's dumps asked for at once, in two rounds
(the dump threads first, faulthandler's signal only for a rank whose Python cannot run), read
back into :class:`RankEvidence`; and an end request delivered to a rank's dump thread. The rank's
side (what :func:`~.evidence.arm` sets up) is in ``evidence``."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .beacon import BeaconSlot
from .ending import END_REQUEST
from .evidence import REQUEST, EvidencePaths, RankEvidence, wake
from .flight import parse_flight_recorder
from .native import native_dumps
from .stacks import ThreadStack, parse_faulthandler, stack_from_data

_POLL_S = 0.02
_STABLE_POLLS = 3  # faulthandler writes in pieces: a size that stays put this many polls is a whole dump
_request_ids = itertools.count(int(time.time() * 1000) % 1_000_000_000 * 1000)


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
        wake(paths.request, END_REQUEST)
    except OSError:
        return False
    return True


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
        """Whether all there is to take was taken: the Python-level dump (with the flight
        recorder's), else faulthandler's."""
        if self.python_data is not None:
            return self.python_data.get("complete", True) is not False
        if self.signalled:
            return self.native_text is not None
        return not self.woken


def request_dumps(
    slots: Iterable[BeaconSlot], timeout_s: float = 3.0, grace_s: float = 1.0, native_frames: bool = False
) -> list[RankEvidence]:
    """Every rank's evidence at once, in two rounds. First every rank's dump thread is woken and
    the Python-level dumps (named stacks, the flight recorder) waited for together, at most
    ``grace_s``. Then only the ranks that gave none (their Python cannot run: native code holds
    the GIL) are signalled for faulthandler's dump, waited for until ``timeout_s`` in all.

    faulthandler walks every thread's frames from a signal handler without the GIL: with another
    thread of the process running Python meanwhile (the dump thread answering, say) that walk can
    crash the process (a SIGSEGV in ``PyCode_Addr2Line`` was seen on a live rank). A process
    whose Python cannot run has no thread changing its frames; one whose Python can answered the
    first round, or has its dump thread answering: before signalling, the request is taken back
    out of the rank's FIFO (:func:`_withdraw`), and a rank whose dump thread took it already is
    waited for, never signalled. Only a process whose slot records a registered signal is
    signalled; a rank that gave nothing says why in ``notes``. With ``native_frames``, a rank
    that gave no Python-level dump gets ``py-spy dump --native`` too (``native.py``), after the
    rounds and bounded on its own."""
    started = time.monotonic()
    pending = []
    for slot in slots:
        paths = EvidencePaths.of(slot.path.parent, slot.rank, slot.pid)
        item = _Pending(slot, paths, next(_request_ids), _size(paths.stacks), [])
        if _is_fifo(paths.request):
            try:
                wake(paths.request, item.request_id)
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
        if item.woken and not _withdraw(item):
            continue  # its dump thread took the request (it runs Python): its dump is waited for
        if not item.slot.dump_signal:
            item.notes.append("faulthandler not registered: not signalled")
            continue
        _empty(item)  # the file holds one dump at most: this one
        try:
            os.kill(item.slot.pid, item.slot.dump_signal)
            item.signalled = True
        except OSError as err:
            item.notes.append(f"could not signal pid {item.slot.pid}: {err.strerror or err}")
    _wait(pending, started + timeout_s)
    frames = native_dumps([i.slot.pid for i in pending if i.python_data is None]) if native_frames else {}
    return [_evidence(item, *frames.get(item.slot.pid, ("", ""))) for item in pending]


def _empty(item: _Pending) -> None:
    """Empty the rank's faulthandler file before its signal: faulthandler appends (the rank opened
    it so), so what it writes next starts the file, and the file never grows past one dump."""
    try:
        os.truncate(item.paths.stacks, 0)
    except OSError:
        return  # read from where it ended, as before
    item.offset, item.last_size, item.stable = 0, -1, 0


def _withdraw(item: _Pending) -> bool:
    """Take ``item``'s request back out of the rank's FIFO, unread; False where the dump thread
    has already taken it (it is answering: its Python runs, and a faulthandler walk of its frames
    meanwhile could crash the process). The dump thread waits with a select and reads only
    once it runs Python; a pipe read is atomic: either this reader or that thread gets the
    bytes, so a withdrawn request is never answered and a taken one never signalled. Requests
    of others read with it are put back."""
    try:
        fd = os.open(item.paths.request, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return True  # the FIFO is gone: the dump thread with it
    try:
        data = os.read(fd, 4096)
    except BlockingIOError:
        data = b""
    except OSError:
        return True
    finally:
        os.close(fd)
    ids = [REQUEST.unpack_from(data, i)[0] for i in range(0, len(data) - len(data) % 8, 8)]
    for other in (i for i in ids if i != item.request_id):
        with contextlib.suppress(OSError):
            wake(item.paths.request, other)
    if item.request_id in ids:
        item.woken = False  # no Python-level dump will come
        item.notes.append("its dump thread did not take the request in time (Python could not run)")
        return True
    return False


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
    if item.woken and not item.done():
        try:
            data = json.loads(item.paths.python.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("request") == item.request_id:
            item.python_data = data  # the stacks first; the flight recorder's with them later


def _evidence(item: _Pending, frames: str = "", why_none: str = "") -> RankEvidence:
    notes = list(item.notes) + ([why_none] if why_none else [])
    if item.signalled and not parse_faulthandler(item.native_text or ""):
        notes.append("no faulthandler dump within the wait")
    if item.woken and item.python_data is None:
        notes.append("no Python-level dump within the wait (Python could not run, or the process is busy)")
    elif item.python_data is not None and item.python_data.get("complete") is False:
        notes.append("the flight recorder's dump did not come within the wait")
    evidence = evidence_from_dumps(
        item.slot.rank, item.slot.pid, item.slot.thread_ident, item.native_text, item.python_data, notes
    )
    return replace(evidence, native_frames=frames) if frames else evidence


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
