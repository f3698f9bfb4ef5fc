"""Reading failures' texts (pure): what shape an exception has (a collective that lost its peer,
Ray's report barrier: by where it was raised, see :func:`shape_of`), the collective an error names
(:func:`collective_of`), what Ray's account of a dead worker says (its memory monitor, a node that
died, a process that exited without a word), and the frames of a traceback's text.

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

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .facts import CollectiveAt, Kind, Shape, UserFrame

# The kind of a collective's failure, read only from an error raised by a collective (below): words
# in lower case, looked for as plain substrings (thousands of ranks fail at once; a pattern of many
# alternatives costs tens of microseconds a message).
_PEER_CLOSED = (
    "connection closed by peer", "connection closed by remote peer", "connection reset by peer", "broken pipe",
    "nccl communicator was aborted", "ncclremoteerror", "remote process exit", "nccl communicator encountered error",
    "processgroupnccl is aborted", "distnetworkerror",
)  # fmt: skip
_PEER_TIMEOUT = (
    "timed out",
    "watchdog caught collective operation timeout",
    "socket timeout",
)  # gloo's "Timed out waiting Nms for recv operation", NCCL's blocking wait and watchdog
# A collective library's own words: gloo's source-tagged errors ("[.../gloo/transport/tcp/pair.cc:553]"),
# NCCL's and torch's c10d's. Never the bare socket words a user's own I/O raises too.
_COLLECTIVE_TEXT = re.compile(
    r"gloo/transport/|\[[^\]\n]*gloo[^\]\n]*\.cc:\d+\]|\bNCCL\b|nccl[A-Z]\w*Error|ProcessGroup[A-Z]\w*|"
    r"WorkNCCL|Watchdog caught collective|Timed out waiting \d+ms for (?:recv|send) operation|\bc10d\b",
)
_DIST_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})  # torch.distributed's
# torch.distributed's own code: c10d, its collectives, DDP's reducer, FSDP, elastic's rendezvous and store.
_DISTRIBUTED_FILE = re.compile(r"/torch/distributed/|/torch/nn/parallel/distributed\.py$")
_TORCH_FILE = re.compile(r"/torch/")
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


def shape_of(error_type: str, message: str, causes: Iterable[str] = (), traceback: str = "") -> Shape:
    """The shape of an exception: a collective that lost or waited out its peers, Ray's report
    barrier, or a failure of its own.

    An error follows a peer only where a collective raised it: its traceback's innermost code is
    ``torch.distributed``'s (c10d, a collective, DDP's reducer, FSDP), or its type is one of
    torch.distributed's errors, or its words are a collective library's own (gloo's, NCCL's); then
    its words say how (a peer's connection closed, reset or aborted; timed out waiting). Words
    alone never make a consequence: a ``ConnectionResetError`` from the user's own S3 read is the
    rank's own failure. Each exception of the chain is judged (a ``SyncError`` raised because
    ``all_reduce`` lost its peer follows it too): with its own frames where ``traceback`` (the
    chain's text) has them; ``causes`` (``"Type: message"`` each) where it has none."""
    texts = [f"{error_type}: {message}", *causes]
    if any(_BARRIER.search(text) for text in texts):  # Ray's own types and actor: no frames needed
        return Shape.BARRIER
    earlier = _CHAINED.split(traceback)[:-1] if traceback else []  # the chain's causes, as the text has them
    if not any(_peer_kind(text) for text in (*texts, *earlier)):  # no word of a peer: its own, wherever raised
        return Shape.OWN
    alone = _collective_shape(error_type, message, ())  # its type or its library's words may say it all
    if alone is Shape.PEER_CLOSED or (alone is Shape.PEER_TIMEOUT and not causes and not earlier):
        return alone
    chain = raises_of(traceback)
    if chain:
        judged = [(r.error_type, r.message, r.frames) for r in chain[:-1]]
        judged.append((error_type, message, chain[-1].frames))
    else:
        judged = [(error_type, message, ())]
        judged += [(*_split(cause), ()) for cause in causes]
    shapes = {_collective_shape(*one) for one in judged}
    for shape in (Shape.PEER_CLOSED, Shape.PEER_TIMEOUT):
        if shape in shapes:
            return shape
    return Shape.OWN


def _split(cause: str) -> tuple[str, str]:
    error_type, _, message = cause.partition(": ")
    return error_type.strip(), message


def _collective_shape(error_type: str, message: str, frames: Sequence[UserFrame]) -> Shape:
    """One exception's shape: a collective's failure (by where it was raised, its type or its
    library's words), and then of which kind; else its own."""
    name = error_type.rsplit(".", 1)[-1]
    text = f"{name}: {message}"
    # Where the frames are unknown (Ray kept no traceback, a cause named by its text only), only a
    # collective library's own type or words can say a collective raised it.
    by_collective = name in _DIST_TYPES or bool(_COLLECTIVE_TEXT.search(text)) or raised_in(frames) == "distributed"
    if not by_collective:
        return Shape.OWN
    kind = _peer_kind(text)
    if kind is not None:
        return kind
    return Shape.PEER_CLOSED if name == "DistNetworkError" else Shape.OWN  # a collective's error of its own


def _peer_kind(text: str) -> Shape | None:
    """How a collective's error says it failed by its peer (lost, or timed out waiting), if it does."""
    low = text.lower()
    if any(word in low for word in _PEER_CLOSED):
        return Shape.PEER_CLOSED
    if any(word in low for word in _PEER_TIMEOUT):
        return Shape.PEER_TIMEOUT
    return None


_FILE_LINE = re.compile(r'File "([^"]+)"')


def waiting_in_collective(traceback: str) -> bool:
    """Whether a stack (a traceback's text, outermost first) ends in torch.distributed's code: its
    thread was blocked in a collective (or a point-to-point wait) when it was taken."""
    files = _FILE_LINE.findall(traceback)
    return bool(files) and _DISTRIBUTED_FILE.search(files[-1].replace("\\", "/")) is not None


def raised_in(frames: Sequence[UserFrame]) -> str:
    """Whose code raised an exception (its frames outermost first): ``distributed`` where the
    innermost code past the standard library is torch.distributed's, ``torch`` where it is torch's
    other code, ``elsewhere`` (the user's, another package's), "" where no frame is known. The
    standard library is passed through (a socket read inside a store is the store's)."""
    seen_torch = False
    for frame in reversed(frames):
        file = frame.file.replace("\\", "/")
        if _DISTRIBUTED_FILE.search(file):
            return "distributed"
        if _TORCH_FILE.search(file):
            seen_torch = True
            continue
        if file.startswith("<") or (_STDLIB.search(file) and not any(m in file for m in _LIBRARY_MARKS)):
            continue
        break
    if seen_torch:
        return "torch"
    return "elsewhere" if frames else ""


@dataclass(frozen=True)
class Raised:
    """One exception of a traceback's chain: its type, message and frames (outermost first)."""

    error_type: str
    message: str
    frames: tuple[UserFrame, ...]


def raises_of(traceback_text: str) -> list[Raised]:
    """The exceptions of a traceback's text, the first raised (the innermost cause) first, the one
    raised last last; those without a ``Traceback (most recent call last):`` of their own left out."""
    return list(_chain(traceback_text)) if traceback_text else []


@functools.lru_cache(maxsize=16)  # a rank's text is read for its shape and its collective; ranks alike share one
def _chain(traceback_text: str) -> tuple[Raised, ...]:
    out = []
    for block in _CHAINED.split(traceback_text):
        lines = block.splitlines()
        head = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
        if head is None:
            continue
        end = next((i for i in range(head + 1, len(lines)) if lines[i] and not lines[i][0].isspace()), len(lines))
        if end == len(lines):
            continue
        error_type, _, first = lines[end].partition(": ")
        message = "\n".join([first, *lines[end + 1 :]]).strip()
        out.append(Raised(error_type.strip(), message, tuple(frames_of("\n".join(lines[head + 1 : end])))))
    return tuple(out)


# NCCL's words for a collective (torch's ProcessGroupNCCL, 2.2 to 2.13): "WorkNCCL(SeqNum=1580,
# OpType=ALLREDUCE, ...", "[PG 1 Rank 4] ... at work: 1580, last enqueued NCCL work: 1582, last
# completed NCCL work: 1579.", "[PG ID 0 PG GUID 0(default_pg) Rank 3]  failure detected by watchdog at
# work sequence id: 59958 PG status: last enqueued work: 59998, last completed work: 59957".
_SEQ = re.compile(r"SeqNum=(\d+)|at work(?: sequence id)?: (\d+)")
_C10D_FRAME = re.compile(r'distributed_c10d\.py", line \d+, in (\w+)')
_NCCL_WORDS = ("SeqNum=", "[PG ", "at work", "enqueued", "completed")
_OP_TYPE = re.compile(r"OpType=(\w+)")
_PG = re.compile(r"\[PG (?:ID \S+ PG GUID |(?!ID ))(?P<pg>[^\s(\]]+)\s*(?:\((?P<desc>[^)]*)\))?")
_COMPLETED = re.compile(r"last completed (?:NCCL )?work: (-?\d+)", re.IGNORECASE)
_ENQUEUED = re.compile(r"last enqueued (?:NCCL )?work: (-?\d+)", re.IGNORECASE)
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather_into_tensor",
        "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "ALLTOALL": "all_to_all",
        "ALLTOALL_BASE": "all_to_all_single", "COALESCED": "coalesced"}  # fmt: skip
# torch.distributed's collectives, as its Python functions are named (distributed_c10d.py).
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "broadcast", "barrier", "monitored_barrier", "all_gather",
    "all_gather_into_tensor", "_all_gather_base", "all_gather_object", "broadcast_object_list", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single", "send", "recv", "isend",
    "irecv", "batch_isend_irecv", "gather", "scatter", "reduce", "gather_object", "scatter_object_list",
})  # fmt: skip


def collective_of(message: str, traceback: str = "") -> CollectiveAt | None:
    """The collective an error names: NCCL's sequence number, operation and process group from its
    words (the watchdog's lines, a blocking wait's ``WorkNCCL(...)``); else the operation from the
    traceback's innermost collective in ``distributed_c10d.py`` (gloo says neither sequence number
    nor group). None where neither says one."""
    text = f"{message}\n{traceback}"
    nccl = any(word in text for word in _NCCL_WORDS)  # the searches below only where NCCL's words are
    seq = _SEQ.search(text) if nccl else None
    op_type = _OP_TYPE.search(text) if nccl else None
    pg = _PG.search(text) if nccl else None
    completed = _COMPLETED.search(text) if nccl else None
    enqueued = _ENQUEUED.search(text) if nccl else None
    op = _OPS.get(op_type.group(1), op_type.group(1).lower()) if op_type else _frame_op(traceback)
    at = CollectiveAt(
        pg.group("pg") if pg else "",
        int(seq.group(1) or seq.group(2)) if seq else None,
        op,
        (pg.group("desc") or "") if pg else "",
        int(completed.group(1)) if completed else None,
        int(enqueued.group(1)) if enqueued else None,
    )
    return at if (at.group or at.seq is not None or at.op) else None


def _frame_op(traceback: str) -> str:
    """The innermost of torch.distributed's collectives the traceback shows (its Python function)."""
    ops = [op for op in _C10D_FRAME.findall(traceback) if op in COLLECTIVES]
    return ops[-1] if ops else ""


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
        m = _FRAME.match(line) if 'File "' in line else None
        if not m:
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if code.startswith(('File "', "Traceback", "During handling", "The above exception")) or set(code) <= set(
            "^~ "
        ):
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
