"""A dead rank's last words (pure): what the tail of its worker's log says of a death that left no
Python exception, read by its node once it finds the process gone without a record.

A process that dies with no exception still prints, as C++ and CPython end it:

- torch's NCCL watchdog, on a rank that waited out a collective (``ProcessGroupNCCL.cpp``, torch
  2.4-2.13): ``[PG 0 Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580,
  OpType=ALLREDUCE, NumelIn=.., NumelOut=.., Timeout(ms)=600000) ran for 600067 milliseconds
  before timing out.`` (the group also as ``[PG ID 0 PG GUID 0(default_pg) Rank 4]``), then
  ``To avoid data inconsistency, we are taking the entire process down.`` and ``SIGABRT``: this
  rank is a *waiter*, and the collective's sequence number says which one it waited in;
- CPython's faulthandler (Ray enables it in its workers): ``Fatal Python error: Aborted`` /
  ``Segmentation fault`` / ``Bus error`` / ``Floating point exception``, the signal by name;
- the C++ runtime: ``terminate called after throwing an instance of ...`` (then ``SIGABRT``);
- CUDA: ``CUDA error: an illegal memory access was encountered`` and its kin.

A SIGKILL (the kernel's OOM killer, ``kill -9``) prints nothing: no last words is no evidence of
anything but that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .facts import CollectiveAt
from .texts import collective_of

MAX_LINES, MAX_LINE = 6, 300  # of the lines that say so, kept for the account (each cut at MAX_LINE characters)
_TAKING_DOWN = "we are taking the entire process down"
_WATCHDOG = "Watchdog caught collective operation timeout"
_TIMEOUT = re.compile(r"Timeout\(ms\)=(\d+)")
_FATAL = re.compile(r"Fatal Python error: (?P<what>Aborted|Segmentation fault|Bus error|Floating point exception)")
_SIGNALS = {"Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
            "Floating point exception": "SIGFPE"}  # fmt: skip
_TERMINATE = "terminate called after throwing an instance of"
_CUDA = re.compile(r"CUDA error: [^\n]+")
# NCCL's words for a peer that went away (its watchdog then takes this process down): a lost peer.
# Only a remote error says so: "NCCL error: unhandled cuda error" or a local NIC's is the rank's own.
_PEER_LOST = re.compile(r"ncclRemoteError|remote process exited|Remote process exited")
# An abort says why in its "Original reason": a remote error is a lost peer, a watchdog's timeout a
# wait; anything else is the rank's own NCCL error.
_ABORTED = "NCCL communicator was aborted"
_NCCL_ERROR = re.compile(r"NCCL error[^\n]*|ncclUnhandledCudaError|ncclSystemError|ncclInternalError")
# The heartbeat monitor ends a rank whose watchdog itself hung (a CUDA or NCCL call that never
# returned on this rank), torch 2.3-2.13: the rank's own, not a wait.
_STUCK_WATCHDOG = re.compile(
    r"ProcessGroupNCCL's watchdog got stuck|Terminating the process after attempting to dump debug info"
)
# torch 2.5+: every rank prints, on a peer's timeout, where its own NCCL work stood (kept as evidence).
_DUMP_SIGNAL = "Received a dump signal due to a collective timeout"
# The words a death's account is made of: a tail without them is searched further back for them.
MARKERS = re.compile(
    "|".join(
        [re.escape(_WATCHDOG), re.escape(_TAKING_DOWN), _FATAL.pattern, re.escape(_TERMINATE), _CUDA.pattern,
         _PEER_LOST.pattern, re.escape(_ABORTED), _NCCL_ERROR.pattern, _STUCK_WATCHDOG.pattern,
         re.escape(_DUMP_SIGNAL)]
    )
)  # fmt: skip


@dataclass(frozen=True)
class LastWords:
    """What a dead rank's log says of its end."""

    signal: str = ""  # "SIGABRT", "SIGSEGV", ...; "" where nothing names one
    by: str = ""  # what ended it, in a few words: "NCCL's watchdog", "a C++ exception", "a CUDA error"
    watchdog: CollectiveAt | None = None  # the collective NCCL's watchdog gave up on: the rank waited in it
    timeout_s: float | None = None  # the process group's timeout, as the watchdog's line says it
    lines: tuple[str, ...] = ()  # the lines that say so, at most MAX_LINES
    peer_lost: bool = False  # NCCL said a peer went away (a remote error): this rank followed a peer's death

    @property
    def found(self) -> bool:
        return bool(self.signal or self.by)


def _watchdog_lines(text: str, line: str) -> str:
    """The watchdog's line and its exception line for the same work (older torch names the group
    only there: ``[PG 1 Rank 4] Exception ... at work: 1580``)."""
    seq = _SEQ_ON.search(line)
    if seq is None:
        return line
    more = next((x for x in text.splitlines() if f"detected by watchdog at work: {seq.group(1)}," in x), "")
    return f"{line}\n{more}"


_SEQ_ON = re.compile(r"SeqNum=(\d+)")


def read_last_words(text: str) -> LastWords:
    """What ``text`` (the tail of a dead rank's stdout and stderr) says of its end."""
    lines: list[str] = []
    signal = by = ""
    watchdog: CollectiveAt | None = None
    timeout_s: float | None = None
    peer_lost = False
    for line in text.splitlines():
        if _WATCHDOG in line:
            if watchdog is None:
                lines_of_work = _watchdog_lines(text, line)
                watchdog = collective_of(lines_of_work)
                if watchdog is not None and not watchdog.group:  # no group named: the default one
                    watchdog = replace(watchdog, group="0")
                timeout = _TIMEOUT.search(line)
                timeout_s = int(timeout.group(1)) / 1000 if timeout else None
                by = "NCCL's watchdog"
            lines.append(line.strip())
        elif _TAKING_DOWN in line:
            signal = signal or "SIGABRT"
            lines.append(line.strip())
        elif (m := _FATAL.search(line)) is not None:
            signal = _SIGNALS[m["what"]]
            lines.append(line.strip())
        elif _TERMINATE in line:
            signal, by = signal or "SIGABRT", by or "a C++ exception"
            lines.append(line.strip())
        elif _STUCK_WATCHDOG.search(line) is not None:
            signal, by = signal or "SIGABRT", by or "NCCL's heartbeat monitor (its watchdog hung on this rank)"
            lines.append(line.strip())
        elif _PEER_LOST.search(line) is not None:
            peer_lost = True
            lines.append(line.strip())
        elif _ABORTED in line or _NCCL_ERROR.search(line) is not None:
            by = by or "an NCCL error"  # its own (a remote error or a watchdog's timeout matched above)
            lines.append(line.strip())
        elif _DUMP_SIGNAL in line:
            lines.append(line.strip())
        elif (m := _CUDA.search(line)) is not None:
            by = by or "a CUDA error"
            lines.append(m.group(0).strip())
    if peer_lost and watchdog is None:
        by = "NCCL, a peer lost"  # its watchdog ends the process on a remote error (then SIGABRT)
        signal = signal or "SIGABRT"
    if watchdog is not None and not signal:
        signal = "SIGABRT"  # TORCH_NCCL_ASYNC_ERROR_HANDLING 1 or 3 (the default): the watchdog aborts
    kept = tuple(dict.fromkeys(line[:MAX_LINE] for line in lines))[-MAX_LINES:]
    return LastWords(signal, by, watchdog, timeout_s, kept, peer_lost and watchdog is None)
