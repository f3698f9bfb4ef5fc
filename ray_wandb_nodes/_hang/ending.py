"""Ending a hung attempt from inside the rank (``on_hang="restart"``): the error raised in its
training thread, so that Ray Train reports it and ``fit()`` names the hang."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import NamedTuple


class HangError(RuntimeError):
    """Raised in a hung rank's training thread to end its attempt (``on_hang="restart"``): the
    error that Ray Train reports, and that ``fit()`` raises once no failure is left, names the
    hang. Raised by type from another thread, so its message waits in ``pending``."""

    pending = "the training hung (ray_wandb_nodes, on_hang='restart')"

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (HangError.pending,)))


class RankProcess(NamedTuple):
    """The one process of a rank that an end may end: the driver side names what it judged, and a
    node ends a slot of the attempt's folder only where all three match (a late end never reaches
    a later attempt's process, another job's, or a process that reuses a dead rank's pid)."""

    rank: int
    pid: int
    proc_start: int  # the process's start time (``/proc/<pid>/stat``, clock ticks; 0: unknown, pid alone)


class EndAnswer(NamedTuple):
    """A node's answer to an end: the ranks it ended, and those it refused (no such process of
    the attempt lives there now: gone already, or another process)."""

    ended: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()


END_REQUEST = (1 << 64) - 1  # a request id that asks the dump thread to end the attempt


def raise_in_training_thread(path: Path) -> None:
    """An end request: :class:`HangError` raised in the thread the request names (it takes
    effect at that thread's next Python instruction)."""
    request = json.loads(path.read_text())
    HangError.pending = str(request["message"])
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(int(request["ident"])), ctypes.py_object(HangError))
