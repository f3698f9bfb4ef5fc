"""The node's side of a hang's evidence: every rank's dumps asked for at once, in two rounds
(the dump threads first, faulthandler's signal only for a rank whose Python provably cannot run),
read back into :class:`RankEvidence`; and an end request delivered to a rank's dump thread. The
rank's side (what :func:`~.evidence.arm` sets up) is in ``evidence``.

**When a rank is signalled.** faulthandler's handler walks every thread's frames without the GIL:
with a thread of the process running Python meanwhile, the walk can crash it (a SIGSEGV in
``PyCode_Addr2Line`` killed a live rank in this project's tests), and the default action of
SIGUSR1/SIGUSR2 ends a process that no longer catches it. A rank that gave no Python-level dump
is signalled only when, from outside and without ptrace, all of these hold:

1. its dump thread was woken and has since woken from its wait for the GIL at least
   :data:`MIN_GIL_WAITS` times (its ``voluntary_ctxt_switches`` in
   ``/proc/<pid>/task/<tid>/status``, the thread id being what the dump thread recorded at its
   start), its process not stopped. CPython's ``take_gil`` waits on a condition for the switch
   interval (5 ms by default) and, each time it expires, asks the holder to drop the GIL; a
   thread running bytecode drops it at its next eval-breaker check and hands it over. So every
   such wake is a moment at which the dump thread ran and no thread of the process was running
   Python: the GIL is held by native code (a C call, a CUDA or NCCL wait that keeps it, a C
   extension's long loop), and the frames faulthandler reads do not move;
2. its request is then still unread, and is taken back out of the FIFO (a pipe read is atomic:
   either this reader or the dump thread has it), so the dump thread never answers it while
   faulthandler walks;
3. its slot records a signal, and ``/proc/<pid>/status``'s ``SigCgt`` still has that signal
   caught, read right before the signal: ``signal.getsignal`` in the rank sees only Python's
   handlers, and a library can reset the signal in C after arming.

Time alone proves nothing: a rank on a throttled pod (its CFS quota spent) or a busy node, or a
stopped one, is slow to be scheduled, and its dump thread does not wake either, so it is not
signalled. Nor is a process's CPU time a proof: a C call that holds the GIL while it sleeps in
the kernel takes none. A rank not proven within the wait says "no answer" with the reason in its
notes, and is asked again at the next request (the request stays in its FIFO meanwhile, so a late
Python-level dump still counts). A switch interval raised by the user (``sys.setswitchinterval``)
slows the wakes: a rank whose dump thread wakes fewer than :data:`MIN_GIL_WAITS` times in the
wait is not signalled. The whole round is bounded by the caller's ``timeout_s``; no signal is
sent in its last :data:`SIGNAL_MARGIN_S`, the time faulthandler's dump needs to be written.
"""

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
from .proc import signal_caught, thread_stopped, thread_wakes
from .stacks import ThreadStack, parse_faulthandler, stack_from_data

_POLL_S = 0.02
_STABLE_POLLS = 3  # faulthandler writes in pieces: a size that stays put this many polls is a whole dump
# The dump thread's wakes from its wait for the GIL that prove no thread runs Python (see above):
# 20 switch intervals is 0.1 s of the dump thread asking, and a second's wait holds about 200.
MIN_GIL_WAITS = 20
SIGNAL_MARGIN_S = 0.5  # no signal later than this before the wait's end: its dump must be written
_WITHDRAWN = "its dump thread did not take the request in time (Python could not run)"
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
    thread: int = 0  # the dump thread's native id (0: unknown)
    waits_at_wake: int | None = None  # its wakes (voluntary context switches) when its request was written
    not_signalled: str = ""  # why, when it gave no Python-level dump and was not signalled
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
    the Python-level dumps (named stacks, the flight recorder) waited for together, at least
    ``grace_s``. Then a rank that gave none is signalled for faulthandler's dump once its Python
    provably cannot run (the module's rules: its dump thread keeps waking for a GIL no Python
    thread hands over, its request is still unread and taken back, its handler still caught),
    checked at each poll until ``timeout_s`` less :data:`SIGNAL_MARGIN_S`; a rank whose dump
    thread took its request is waited for, never signalled. A rank that gave nothing says why in
    ``notes``. With ``native_frames``, a rank that gave no Python-level dump gets ``py-spy dump
    --native`` too (``native.py``), after the rounds and bounded on its own."""
    started = time.monotonic()
    pending = []
    for slot in slots:
        paths = EvidencePaths.of(slot.path.parent, slot.rank, slot.pid)
        item = _Pending(slot, paths, next(_request_ids), _size(paths.stacks), [])
        if _is_fifo(paths.request):
            item.thread = _thread_id(paths)
            item.waits_at_wake = thread_wakes(slot.pid, item.thread)  # before the wake: every later one counts
            try:
                wake(paths.request, item.request_id)
                item.woken = True
            except OSError as err:
                item.notes.append(f"dump thread not reachable: {err.strerror or err}")
        else:
            item.notes.append("no dump thread (not armed)")
        pending.append(item)
    _wait(pending, started + min(grace_s, timeout_s))
    last_signal = started + max(min(grace_s, timeout_s), timeout_s - SIGNAL_MARGIN_S)
    while True:
        for item in pending:
            _poll(item)
            if not item.signalled and item.python_data is None and time.monotonic() <= last_signal:
                _signal_if_stuck(item)
        if all(item.done() for item in pending) or time.monotonic() >= started + timeout_s:
            break
        time.sleep(_POLL_S)
    for item in pending:
        if item.python_data is None and not item.signalled and item.not_signalled:
            item.notes.append(f"not signalled: {item.not_signalled}")
    frames = native_dumps([i.slot.pid for i in pending if i.python_data is None]) if native_frames else {}
    return [_evidence(item, *frames.get(item.slot.pid, ("", ""))) for item in pending]


def _signal_if_stuck(item: _Pending) -> None:
    """Signal ``item``'s rank for faulthandler's dump where its Python provably cannot run (the
    module's rules, in order); else say why not in ``item.not_signalled``, for this round."""
    if _acked(item):
        item.not_signalled = ""
        return  # its dump thread is answering: its Python runs
    why = _why_not_stuck(item)
    if why:
        item.not_signalled = why
        return
    if item.woken and not _withdraw(item):
        item.not_signalled = ""
        return  # its dump thread took the request (it runs Python): its dump is waited for
    if not signal_caught(item.slot.pid, item.slot.dump_signal):
        item.not_signalled = f"signal {item.slot.dump_signal} is no longer caught in the process (SigCgt)"
        _rewake(item)
        return
    _empty(item)  # the file holds one dump at most: this one
    try:
        os.kill(item.slot.pid, item.slot.dump_signal)
        item.signalled = True
    except OSError as err:
        item.notes.append(f"could not signal pid {item.slot.pid}: {err.strerror or err}")
        _rewake(item)


def _why_not_stuck(item: _Pending) -> str:
    """Why ``item``'s rank is not shown unable to run Python ("": it is, rule 1 of the module)."""
    if not item.slot.dump_signal:
        return "faulthandler not registered"
    if not item.woken:
        return "no dump thread to show that its Python cannot run"
    if not item.thread or item.waits_at_wake is None:
        return "its dump thread's id is unknown, so it cannot be shown that its Python cannot run"
    if thread_stopped(item.slot.pid, item.thread):
        return "the process is stopped (SIGSTOP, or a debugger)"
    if not _ack(item)[1]:  # its GIL waits are then those of a thread that runs Python
        return "its dump thread is still answering an earlier request (its Python runs)"
    now = thread_wakes(item.slot.pid, item.thread)
    waits = -1 if now is None else now - item.waits_at_wake
    if waits < MIN_GIL_WAITS:
        return (
            f"its dump thread woke {max(waits, 0)} times waiting for the GIL, not the {MIN_GIL_WAITS} that show "
            "no thread runs Python (a throttled or busy node is slow to schedule it)"
        )
    return ""


def _thread_id(paths: EvidencePaths) -> int:
    try:
        return int(paths.thread.read_text())
    except (OSError, ValueError):
        return 0


def _rewake(item: _Pending) -> None:
    """Put a withdrawn request back: the rank is not signalled, and its dump thread may yet answer."""
    if item.woken:
        return
    with contextlib.suppress(OSError):
        wake(item.paths.request, item.request_id)
        item.woken = True
        item.notes = [n for n in item.notes if n != _WITHDRAWN]


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
        item.notes.append(_WITHDRAWN)
        return True
    return False


def _ack(item: _Pending) -> tuple[int, bool]:
    """The request the dump thread took last, and whether it has answered it (0: none yet)."""
    try:
        words = item.paths.ack.read_text().split()
        return int(words[0]), words[1:] == ["done"]
    except (OSError, ValueError, IndexError):
        return 0, True


def _acked(item: _Pending) -> bool:
    return _ack(item)[0] == item.request_id


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
