"""Reading failures' texts (pure): what shape an exception has (a collective that lost its peer,
Ray's report barrier), what Ray's account of a dead worker says (its memory monitor, a node that
died, a process that exited without a word), and the innermost frame of the user's code in a
traceback.

The texts are the libraries' own, matched by phrases that stay put across their releases:

- gloo (torch 2.13, ``gloo/transport/tcp/pair.cc``): ``Connection closed by peer [addr]:port``
  and ``Read error [addr]:port: Connection reset by peer`` when a peer's process is gone,
  ``Timed out waiting ...ms for recv operation to complete`` when a peer never sends
  (captured in ``tests/support/crash_evidence/``);
- NCCL through torch (``ProcessGroupNCCL.cpp``, ``NCCLUtils``): ``NCCL communicator was aborted on
  rank N``, ``ncclRemoteError: A call failed possibly due to a network error or a remote process
  exiting prematurely``, ``remote process exited or there was a network error``, and the
  watchdog's ``Watchdog caught collective operation timeout``;
- Ray 2.50-2.60: ``BroadcastCollectiveTimeoutError`` (``... have not joined the collective
  operation``), the ``SynchronizationActor`` behind the report barrier, and the raylet's and
  GCS's words for a dead worker (see :func:`ray_death`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .facts import Kind, Shape, UserFrame

_PEER_CLOSED = re.compile(
    r"Connection closed by (?:remote )?peer|Connection reset by peer|Broken pipe|"
    r"NCCL communicator was aborted|ncclRemoteError|remote process exit|"
    r"NCCL communicator encountered error|ProcessGroupNCCL is aborted|DistNetworkError",
    re.IGNORECASE,
)
_PEER_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for (?:recv|send) operation|Watchdog caught collective operation timeout|"
    r"operation timed out|Socket Timeout",
    re.IGNORECASE,
)
_BARRIER = re.compile(
    r"BroadcastCollectiveTimeoutError|CollectiveTimeoutError|have not joined the collective operation|"
    r"class_name: SynchronizationActor",
)
# Where a Ray account of a dead worker says what killed it (raylet and GCS, 2.50 to 2.60).
RAY_MEMORY_MONITOR = "killed due to the node running low on memory"  # 2.50 "Task was ..."; 2.55+ "N worker(s) were ..."
RAY_NODE_DIED = "The actor died because its node has died"
RAY_WORKER_EXITED = "Worker unexpectedly exits with a connection error code"
_MEMORY_LINE = re.compile(r"Memory on the node \(IP: [^)]*\) was [^\n;(]*")
_PROCESS_GB = re.compile(r"actual memory used=([\d.]+)GB")
_EXIT = re.compile(r"Worker exit type: (\w+)(?: Worker exit detail: ([^.\n]*))?")
_CHAINED = re.compile(
    r"\n\s*(?:The above exception was the direct cause of the following exception:|"
    r"During handling of the above exception, another exception occurred:)\s*\n"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/ray_wandb_nodes/")
_STDLIB = re.compile(r"/lib/python3\.\d+/")
_NUMBERS = re.compile(r"\d+")
_GLOO_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")  # "[/__w/pytorch/.../pair.cc:553] "
_GLOO_TAIL = re.compile(r"\. This is typically caused by .*$", re.DOTALL)


def shape_of(error_type: str, message: str, causes: Iterable[str] = ()) -> Shape:
    """The shape of an exception from its type, message and causes (``"Type: message"`` each): a
    collective that lost or waited out its peers, Ray's report barrier, or a failure of its own."""
    texts = [f"{error_type}: {message}", *causes]
    for pattern, shape in ((_BARRIER, Shape.BARRIER), (_PEER_CLOSED, Shape.PEER_CLOSED),
                           (_PEER_TIMEOUT, Shape.PEER_TIMEOUT)):  # fmt: skip
        if any(pattern.search(text) for text in texts):
            return shape
    return Shape.OWN


@dataclass(frozen=True)
class RayDeath:
    """What Ray's account of a dead worker says."""

    kind: Kind  # SIGNAL, OOM or LOST
    detail: str  # the account in one line: "Worker exit type: SYSTEM_ERROR ..." or the monitor's line
    memory: str = ""  # Ray's memory monitor's line about the node ("Memory on the node ... was ...")
    process_gb: float | None = None


def ray_death(error_type: str, message: str, preempted: bool = False) -> RayDeath:
    """Ray's account of a worker that died (an ``ActorDiedError`` or ``OutOfMemoryError`` text):

    - its memory monitor (``OutOfMemoryError``; "... killed due to the node running low on
      memory. Memory on the node (IP: .., ID: ..) was 3.60GB used / 23.54GB limit ...",
      "... pid=N, actual memory used=1.92GB ...");
    - its node died (the GCS: "The actor died because its node has died. Node Id: ..."), or was
      preempted (``RayActorError.preempted``);
    - otherwise the process exited with no word (the raylet: "Worker exit type: SYSTEM_ERROR
      Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of
      file", which a SIGKILL, the kernel's OOM killer and a segfault all leave).
    """
    if error_type.endswith("OutOfMemoryError") or RAY_MEMORY_MONITOR in message:
        memory = _MEMORY_LINE.search(message)
        gb = _PROCESS_GB.search(message)
        line = memory.group(0).strip() if memory else first_line(message)
        return RayDeath(Kind.OOM, f"killed by Ray's memory monitor: {line}", line, float(gb.group(1)) if gb else None)
    if preempted:
        return RayDeath(Kind.LOST, "its node was preempted")
    if RAY_NODE_DIED in message:
        start = message.index(RAY_NODE_DIED)
        return RayDeath(Kind.LOST, " ".join(message[start:].split())[:300])
    exit_ = _EXIT.search(message)
    if exit_:
        detail = f"Worker exit type: {exit_.group(1)}" + (f"; {exit_.group(2).strip()}" if exit_.group(2) else "")
        return RayDeath(Kind.SIGNAL, detail)
    return RayDeath(Kind.SIGNAL, first_line(message))


def frames_of(traceback_text: str) -> list[UserFrame]:
    """The frames of a Python traceback's text, outermost first, each with its source line."""
    lines = traceback_text.splitlines()
    out: list[UserFrame] = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        if code.startswith(("Traceback", "During handling", "The above exception")) or set(code) <= set("^~ "):
            code = ""
        out.append(UserFrame(m["file"], int(m["line"]), m["function"].strip(), code))
    return out


def causes_of(traceback_text: str) -> tuple[str, ...]:
    """The causes a traceback's text shows (``Type: message`` each, the nearest first): what Ray
    keeps of a raise has lost the exception's ``__cause__`` and ``__context__``, not their text."""
    blocks = _CHAINED.split(traceback_text)
    out = []
    for block in blocks[:-1]:
        last = next((line.strip() for line in reversed(block.splitlines()) if line.strip()), "")
        if last and not _FRAME.match(last):
            out.append(last)
    return tuple(reversed(out))


def is_library(file: str) -> bool:
    """Whether ``file`` is the standard library, an installed package, frozen, or this plugin."""
    return file.startswith("<") or any(mark in file for mark in _LIBRARY_MARKS) or bool(_STDLIB.search(file))


def innermost_user_frame(frames: Sequence[UserFrame]) -> UserFrame | None:
    """The innermost frame of the user's code (outermost first in ``frames``); where every frame
    is a library's (the user's code installed as a package), the innermost frame."""
    for frame in reversed(frames):
        if not is_library(frame.file):
            return frame
    return frames[-1] if frames else None


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, at most ``limit`` characters."""
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def short_message(message: str, limit: int = 300) -> str:
    """An exception's message for one line: a gloo message without its source prefix and its
    advice ("[.../pair.cc:553] Connection closed by peer [127.0.0.1]:21651. This is typically
    ..." -> "Connection closed by peer [127.0.0.1]:21651")."""
    text = _GLOO_TAIL.sub("", _GLOO_PREFIX.sub("", message.strip()))
    return first_line(text, limit)


def normalized(message: str) -> str:
    """A message with its numbers as ``N``: ranks that failed alike (ports, sizes aside)."""
    return _NUMBERS.sub("N", short_message(message))
