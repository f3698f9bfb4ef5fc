"""Stacks as typed values: faulthandler's text parsed into threads and frames, and every thread's
Python stack taken in process, the training thread first.

Frames are innermost first (faulthandler's "most recent call first"). A thread's ``ident`` is
``threading.get_ident()``, which is what faulthandler prints as ``Thread 0x...`` and what the
beacon records for the thread that stamps progress: that is how the training thread is found in
a C-level dump that carries no thread names.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Ray Train runs the train function in ``TrainingThread(<name of the train function>)``
# (ray/train/v2/_internal/execution/worker_group/thread_runner.py, Ray 2.60).
TRAINING_THREAD_PREFIX = "TrainingThread("

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(?P<name>.*)\])? \(most recent call first\):$")
_SINGLE = re.compile(r"^Stack \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$')


@dataclass(frozen=True)
class Frame:
    """One Python frame."""

    file: str
    line: int | None  # None where faulthandler printed ``???``
    function: str

    @property
    def place(self) -> str:
        """``train.py:71``: the file's base name and the line."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line if self.line is not None else '?'}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread's stack, innermost frame first."""

    ident: int
    frames: tuple[Frame, ...]
    name: str | None = None  # known in process; faulthandler (before Python 3.14) prints none
    current: bool = False  # faulthandler's "Current thread": the one that ran the signal handler
    truncated: bool = False  # faulthandler stopped at its depth limit or found a frame it could not read


def parse_faulthandler(text: str) -> list[tuple[ThreadStack, ...]]:
    """Every dump in ``text`` (a file faulthandler appended to), each a tuple of threads in the
    order printed. Lines that are not faulthandler's are ignored."""
    dumps: list[list[ThreadStack]] = []
    ident: int | None = None
    name: str | None = None
    current = truncated = False
    frames: list[Frame] = []

    def close() -> None:
        if ident is not None:
            dumps[-1].append(ThreadStack(ident, tuple(frames), name, current, truncated))

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        header = _HEADER.match(line)
        if header or _SINGLE.match(line):
            close()
            new_ident = int(header.group(2), 16) if header else 0
            # A dump starts again where a thread repeats or where faulthandler reports one stack.
            if not dumps or header is None or any(t.ident == new_ident for t in dumps[-1]):
                dumps.append([])
            ident, frames, truncated = new_ident, [], False
            name = header.group("name") if header else None
            current = bool(header and header.group(1) == "Current thread")
            continue
        frame = _FRAME.match(line)
        if frame and ident is not None:
            number = frame.group("line")
            frames.append(Frame(frame.group("file"), None if number == "???" else int(number), frame.group("function")))
        elif ident is not None and line.strip() in ("...", "<truncated>", "<no Python frame>"):
            truncated = truncated or line.strip() != "<no Python frame>"
    close()
    return [tuple(d) for d in dumps if d]


def python_stacks(exclude: Iterable[int] = ()) -> list[ThreadStack]:
    """Every thread's Python stack in this process, by ``sys._current_frames()`` (needs the GIL:
    a process stuck in native code that holds it never gets here, faulthandler's dump covers it)."""
    skip = set(exclude)
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, top in sys._current_frames().items():
        if ident in skip:
            continue
        frames = []
        frame: Any = top
        while frame is not None:
            frames.append(Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back
        out.append(ThreadStack(ident, tuple(frames), names.get(ident)))
    return out


def training_first(stacks: Iterable[ThreadStack], training_ident: int = 0) -> list[ThreadStack]:
    """Threads with the training thread first: the one whose ident the beacon recorded, else the
    one Ray Train names ``TrainingThread(...)``; then the others in their order."""
    stacks = list(stacks)
    main = training_thread(stacks, training_ident)
    return ([main] if main else []) + [s for s in stacks if s is not main]


def training_thread(stacks: Iterable[ThreadStack], training_ident: int = 0) -> ThreadStack | None:
    """The training thread of ``stacks``, or None where neither its ident nor its name is known."""
    stacks = list(stacks)
    for stack in stacks:
        if training_ident and stack.ident == training_ident:
            return stack
    for stack in stacks:
        if stack.name and stack.name.startswith(TRAINING_THREAD_PREFIX):
            return stack
    return None


def stack_to_data(stack: ThreadStack) -> dict[str, Any]:
    """A JSON-ready form of ``stack`` (the dump thread writes it; :func:`stack_from_data` reads it)."""
    return {
        "ident": stack.ident,
        "name": stack.name,
        "current": stack.current,
        "truncated": stack.truncated,
        "frames": [[f.file, f.line, f.function] for f in stack.frames],
    }


def stack_from_data(data: dict[str, Any]) -> ThreadStack:
    return ThreadStack(
        ident=int(data["ident"]),
        frames=tuple(Frame(str(f), None if n is None else int(n), str(fn)) for f, n, fn in data["frames"]),
        name=data.get("name"),
        current=bool(data.get("current", False)),
        truncated=bool(data.get("truncated", False)),
    )


def format_stack(stack: ThreadStack) -> str:
    """``stack`` as faulthandler would print it, with the thread's name where known."""
    label = f"Thread 0x{stack.ident:016x}" + (f" [{stack.name}]" if stack.name else "")
    lines = [f"{label} (most recent call first):"]
    lines += [
        f'  File "{f.file}", line {f.line if f.line is not None else "???"} in {f.function}' for f in stack.frames
    ]
    return "\n".join(lines)
