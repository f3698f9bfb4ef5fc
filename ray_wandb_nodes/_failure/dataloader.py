"""A DataLoader worker's failure, read from the exception its rank's loop raised (pure).

torch's DataLoader (2.x, ``torch/_utils.py`` ``ExceptionWrapper.reraise``,
``torch/utils/data/_utils/signal_handling.py``, ``torch/csrc/DataLoader.cpp``) hands a worker's
failure to the main process's ``for batch in loader`` in words, never as the worker's exception:

- the worker raised: the same type, with the message ``Caught ValueError in DataLoader worker
  process 0.`` then ``Original Traceback (most recent call last):`` and the worker's traceback;
- the worker was killed: ``RuntimeError: DataLoader worker (pid 4883) is killed by signal:
  Killed.`` (SIGKILL: the kernel's OOM killer, most likely), or, with too little ``/dev/shm``,
  ``... killed by signal: Bus error. It is possible that dataloader's workers are out of shared
  memory. ...``; either may come as the cause of ``DataLoader worker (pid(s) 4883) exited
  unexpectedly``.

(Captured in ``tests/support/crash_evidence/dataloader.json``.) The cause is then the worker's:
its exception and innermost user frame, or its kill named for memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .facts import Kind, UserFrame
from .texts import frames_of, innermost_user_frame, raises_of

_CAUGHT = re.compile(
    r"Caught (?P<type>[\w.]+) in DataLoader worker process (?P<worker>\d+)\.\s*\n"
    r"Original (?P<traceback>Traceback \(most recent call last\):\n.*)",
    re.DOTALL,
)
_KILLED = re.compile(r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: (?P<signal>[^.\n]+)\.")
_SHM = "out of shared memory"


@dataclass(frozen=True)
class WorkerFailure:
    """What a DataLoader worker's failure makes of its rank's: the cause to name instead."""

    kind: Kind  # RAISED (the worker's exception) or OOM (killed for memory, or out of /dev/shm)
    error_type: str  # "ValueError in DataLoader worker 0"; for a kill, the rank's own exception's type
    message: str  # the worker's message; for a kill, what it means, in words a user searches for
    frame: UserFrame | None = None  # the worker's innermost user frame (a raise)


def worker_failure(
    error_type: str, message: str, traceback: str = "", causes: Iterable[str] = ()
) -> WorkerFailure | None:
    """The DataLoader worker's failure behind a rank's exception (its type, message, traceback's
    text and causes), or None where it is not a DataLoader worker's."""
    texts = [message, *causes, traceback]
    for i, text in enumerate(texts):
        caught = _CAUGHT.search(text)
        if caught is not None:
            return _raised(caught, last=i == 0)
    for text in texts:
        killed = _KILLED.search(text)
        if killed is not None:
            return _killed(error_type, killed, text)
    return None


def _raised(caught: re.Match[str], last: bool) -> WorkerFailure:
    worker_text = caught.group("traceback")
    name = caught.group("type").rsplit(".", 1)[-1]
    chain = raises_of(worker_text)
    # In the rank's own message the worker's traceback comes last: its last exception is the
    # worker's. In a cause's or a whole traceback's text the main process's exceptions may follow
    # it: the first of the worker's type.
    ours = [r for r in chain if r.error_type.rsplit(".", 1)[-1] == name]
    raised = (chain[-1] if last else ours[0]) if ours else (chain[-1] if chain else None)
    message = raised.message if raised is not None else ""
    frames = list(raised.frames) if raised is not None else frames_of(worker_text)
    where = f"{caught.group('type')} in DataLoader worker {caught.group('worker')}"
    return WorkerFailure(Kind.RAISED, where, message, innermost_user_frame(frames))


def _killed(error_type: str, killed: re.Match[str], text: str) -> WorkerFailure:
    pid, signal = killed.group("pid"), killed.group("signal").strip()
    if signal == "Killed":
        words = (f"DataLoader worker (pid {pid}) was killed by SIGKILL: out of memory, most likely the "
                 "kernel's OOM killer")  # fmt: skip
        return WorkerFailure(Kind.OOM, error_type, words)
    if signal == "Bus error" and _SHM in text[killed.end() : killed.end() + 200]:
        return WorkerFailure(
            Kind.OOM, error_type, f"DataLoader worker (pid {pid}) died of a bus error: {_SHM} (/dev/shm)"
        )
    return WorkerFailure(Kind.RAISED, error_type, f"DataLoader worker (pid {pid}) is killed by signal: {signal}.")
