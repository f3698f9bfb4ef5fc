"""What is known of one rank's failure, as plain values: the row of the table the first death is
chosen from (:class:`RankFailure`), and what Ray's controller said of each rank on the poll it
decided on (:class:`RayPoll`), read from Ray's objects by ``_ray.failures``.

Order comes from facts that need no two hosts' clocks: whether Ray's controller saw the failure on
the poll it decided on, whether that poll found the rank still running (then it failed later), and
a window on its own node's monotonic clock, comparable only with another rank's on that node.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .._ray.failures import RayPoll, RayRankError

__all__ = ["RayPoll", "RayRankError"]  # what Ray said of a rank: read by ``_ray``, typed there


class Kind(enum.Enum):
    """How a rank ended."""

    RAISED = "raised"  # its train function raised: a Python exception, its type and message known
    SIGNAL = "signal"  # its process died with no Python acting: a kill (SIGKILL), a crash (SIGSEGV), an abort
    OOM = "oom"  # killed for memory: Ray's memory monitor said so, or its node's cgroup counted an OOM kill
    LOST = "lost"  # its node left the cluster (ended, unreachable or preempted)
    UNRESPONSIVE = "unresponsive"  # its process stopped answering Ray's health check
    STUCK = "stuck"  # it stopped outside a collective while the others timed out waiting for it (``stuck``)


class Shape(enum.Enum):
    """What a failure looks like: a failure of its own, or one that follows another rank's."""

    OWN = "own"
    PEER_CLOSED = "peer_closed"  # a collective whose connection to a peer closed, reset or was aborted
    PEER_TIMEOUT = "peer_timeout"  # a collective timed out waiting for its peers
    BARRIER = "barrier"  # Ray Train's report barrier, timed out or abandoned waiting for other ranks

    @property
    def follows(self) -> bool:
        """Whether a failure of this shape follows another rank's (never a cause of its own)."""
        return self is not Shape.OWN


@dataclass(frozen=True)
class UserFrame:
    """The innermost frame of the user's code in a traceback (outside the standard library and
    installed packages), where a rank's exception is the user's to read."""

    file: str
    line: int | None
    function: str
    code: str = ""  # the source line, stripped ("" where the file was not readable)

    @property
    def place(self) -> str:
        """``train.py:59``: the file's base name and the line."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line if self.line is not None else '?'}"

    @property
    def text(self) -> str:
        """``train.py:59 in load_shard: raise ValueError(...)``."""
        return f"{self.place} in {self.function}" + (f": {self.code}" if self.code else "")


@dataclass(frozen=True)
class OomEvidence:
    """Why a death without Python may have been for memory, as its node can tell."""

    ray_monitor: str = ""  # Ray's memory monitor's account ("Memory on the node ... was 3.60GB used / 23.54GB limit")
    process_gb: float | None = None  # the killed process's memory, as Ray's memory monitor measured it
    cgroup_oom_kills: int | None = None  # OOM kills the node's memory cgroup counted during the run (None: unknown)
    at_death: int | None = None  # ... of them as the process died (between its node's looks); None: unknown
    memory_percent: float | None = None  # the node's last memory sample (% of its memory in use)
    own_cgroup: bool = False  # ``at_death`` is the killed process's own memory cgroup's count (else the node's)
    limit: int | None = None  # that cgroup's memory limit, bytes (the tightest from it up; None: none or unknown)
    peak: int | None = None  # its peak usage, bytes
    rss: int | None = None  # the killed process's resident memory at its node's last look alive, bytes
    grew: tuple[int, int, int] | None = None  # the rank of its node that grew most: (rank, first, peak bytes)

    @property
    def found(self) -> bool:
        """Whether something says memory: Ray's monitor killed it, or the cgroup counted a kill as
        it died (or during the run, where its node did not see when it died)."""
        if self.ray_monitor:
            return True
        return self.at_death > 0 if self.at_death is not None else (self.cgroup_oom_kills or 0) > 0


@dataclass(frozen=True)
class Window:
    """When a rank died, on its node's monotonic clock (nanoseconds): a raise knows its moment
    (``after_ns == before_ns``); a death without Python lies between the last sign of life and
    the first look that found the process gone."""

    after_ns: int
    before_ns: int

    def before(self, other: Window) -> bool:
        """Whether this death certainly came first (the windows are on one node's clock)."""
        return self.before_ns < other.after_ns


@dataclass(frozen=True)
class CollectiveAt:
    """The collective a rank's error names (``texts.collective_of``): its process group, its
    sequence number in that group and its operation, as the hang rule's flight records name them."""

    group: str  # the process group's name (``0``: the default group); "" where the text does not say
    seq: int | None  # the collective's sequence number in its group (NCCL's ``SeqNum``); None: not said (gloo)
    op: str  # ``all_reduce``, ``broadcast``, ``barrier``, ... ("" where not said)
    desc: str = ""  # torch's description of the group (``default_pg``, ``mesh_tp``)
    completed: int | None = None  # the group's last completed sequence number on this rank (NCCL's watchdog)
    enqueued: int | None = None  # ... and its last enqueued


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: a row of the table the first death is chosen from."""

    rank: int
    node: str  # the node's label
    gpus: tuple[str, ...]  # the GPU ids Ray gave the rank
    kind: Kind
    shape: Shape = Shape.OWN
    error_type: str = ""  # "ValueError", "torch.OutOfMemoryError" ("" for a death without Python)
    message: str = ""  # the exception's message, or Ray's account of the death
    frame: UserFrame | None = None  # the innermost user frame of a raise
    traceback: str = ""  # the rank's traceback (its own record's where it left one, else Ray's)
    oom: OomEvidence | None = None
    by_ray: bool = True  # Ray's controller saw it on the poll it decided on
    alive_after: bool = False  # that poll found the rank running: it failed after the job was failing
    window: Window | None = None  # when, on its node's clock
    collective: CollectiveAt | None = None  # the collective its error names (group, sequence number, op)
    signal: str = ""  # the signal that ended a death, where its last words name it ("SIGABRT")
    ended_by: str = ""  # what sent it, where they say ("NCCL's watchdog", "a C++ exception")
