"""Where one rank is, from its training thread's stack and its flight recorder: in a torch
collective, in Ray Train's report barrier, or elsewhere (its innermost frame of user code).

The training thread is the beacon's thread, else Ray Train's ``TrainingThread``. A rank is in a
collective at a frame of ``torch/distributed`` named for one, with the sequence number from the
flight recorder (or with a collective in flight and no frame named for it: launched from C++, as
DDP's reducer does inside backward); in Ray Train's report barrier at a frame of ``ray/train``
named ``report``, or in the beacon's ``IN_REPORT`` phase; elsewhere at its innermost frame of user
code (see :func:`is_library`). Who waits on whom across ranks is the verdict's (``verdict``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .beacon import Phase, RankProgress
from .evidence import RankEvidence
from .flight import Collective
from .stacks import Frame, ThreadStack, training_thread

COLLECTIVES = frozenset(
    "all_reduce all_gather all_gather_into_tensor all_gather_object all_to_all all_to_all_single barrier "
    "broadcast broadcast_object_list gather gather_object reduce reduce_scatter reduce_scatter_tensor "
    "scatter scatter_object_list send recv isend irecv batch_isend_irecv monitored_barrier".split()
)
RAY_BARRIERS = {"report": "Ray Train's report barrier", "barrier": "ray.train.collective.barrier",
                "broadcast_from_rank_zero": "ray.train.collective.broadcast_from_rank_zero"}  # fmt: skip
P2P = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# Installed packages whose frames are library for the "where" of a rank: torch and its own
# packages, Ray, this plugin, and the frameworks' step loop machinery (the trainer that calls the
# user's code and the engines it drives), with the numeric and logging libraries every job calls.
# A user's code is what it would change: a training package installed with pip (torchtitan,
# NeMo, Megatron, an in-house one) is user code, and so is any package not named here. Where in
# doubt, user code: a library frame taken for the user's shows its own true file and line, but a
# user's frame taken for a library's hides the place the user must look at.
LIBRARY_PACKAGES = frozenset(
    "torch torchvision torchaudio torchdata functorch triton ray ray_wandb_nodes transformers accelerate "
    "deepspeed lightning pytorch_lightning lightning_fabric numpy wandb".split()
)
_INSTALLED = re.compile(r"/(?:site|dist)-packages/([^/]+)")
_STDLIB = re.compile(r"/lib/python3(?:\.\d+)?/")


class Kind(enum.Enum):
    """Where a rank's training thread is."""

    COLLECTIVE = "collective"  # waits in a torch collective
    RAY_BARRIER = "ray_barrier"  # waits in Ray Train's report (or collective) barrier
    ELSEWHERE = "elsewhere"  # in user code or a library call that is not a wait on the others
    UNKNOWN = "unknown"  # no stack came back


@dataclass(frozen=True)
class RankFacts:
    """What the verdict knows of one rank; ``node`` and ``gpus`` come from the worker group."""

    progress: RankProgress
    evidence: RankEvidence | None = None
    node: str = ""
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Position:
    """Where one rank is."""

    kind: Kind
    where: Frame | None  # the innermost frame of user code (the call site of a wait)
    inner: Frame | None  # the innermost frame of all, where it is not ``where``
    op: str = ""  # the collective or barrier
    seq: int | None = None  # the collective's sequence number in its process group
    pg: str = ""  # the collective's process group (its name)
    stack: tuple[Frame, ...] = ()
    group: str = ""  # the process group as the sentence names it (``default_pg``, ``mesh_tp``, ``group 3``)
    pending: tuple[Collective, ...] = ()  # every collective it waits in, one a group (``FlightRecord.pending``)

    def place(self) -> str:
        """``load_next_shard (train.py:71)``; a library frame inside it named first."""
        if self.where is None and self.inner is None:
            return "no stack"
        if self.where is None:
            assert self.inner is not None
            return f"{self.inner.function} ({self.inner.place})"
        own = f"{self.where.function} ({self.where.place})"
        if self.inner is not None and self.kind is Kind.ELSEWHERE:
            return f"{self.inner.function} ({self.inner.place}) called from {own}"
        return own


def is_library(file: str) -> bool:
    """Whether ``file`` is library code for a rank's "where": frozen, the standard library, this
    plugin, or an installed package of :data:`LIBRARY_PACKAGES`; any other installed package is
    user code."""
    if file.startswith("<"):
        return True
    installed = _INSTALLED.search(file)
    if installed is not None:
        top = installed.group(1)
        return (top[:-3] if top.endswith(".py") else top) in LIBRARY_PACKAGES
    return bool(_STDLIB.search(file)) or "/ray_wandb_nodes/" in file


def group_label(pg: str, desc: str) -> str:
    """A process group as the sentence names it: torch's description where it has one that
    says something (``default_pg``, ``mesh_tp``, the user's ``group_desc``), else ``group <name>``."""
    return desc if desc and desc != "undefined" else f"group {pg}"


def position(facts: RankFacts) -> Position:
    """Where one rank is, from its training thread's stack and its flight recorder."""
    evidence = facts.evidence
    thread: ThreadStack | None = None
    if evidence is not None:
        thread = training_thread(evidence.stacks, evidence.training_ident)
        if thread is None and len(evidence.stacks) == 1:
            thread = evidence.stacks[0]
    if thread is None or not thread.frames:
        kind = Kind.RAY_BARRIER if facts.progress.phase is Phase.IN_REPORT else Kind.UNKNOWN
        return Position(kind, None, None, "report" if kind is Kind.RAY_BARRIER else "")
    frames = thread.frames
    user_at = next((i for i, f in enumerate(frames) if not is_library(f.file)), None)
    where = frames[user_at] if user_at is not None else None
    inner = frames[0] if user_at != 0 else None
    outer_lib = frames[: user_at if user_at is not None else len(frames)]
    record = evidence.flight if evidence is not None else None
    pending = tuple(record.pending()) if record is not None else ()
    for frame in reversed(outer_lib):  # the outermost library call names the wait
        if "/torch/distributed/" in frame.file and frame.function in COLLECTIVES:
            if frame.function in P2P:  # a send or recv: its number is not the group's
                return Position(Kind.COLLECTIVE, where, None, frame.function, stack=frames)
            # The collective it waits in: of each group's oldest not completed, the one the frame
            # names (a barrier is recorded as an all_reduce: else the oldest of all).
            now = next((c for c in pending if c.op == frame.function), pending[0] if pending else None)
            return _in_collective(facts, where, frame.function, now, frames, pending)
        if "/ray/train/" in frame.file and frame.function in RAY_BARRIERS:
            return Position(Kind.RAY_BARRIER, where, None, frame.function, stack=frames)
    if facts.progress.phase is Phase.IN_REPORT:
        return Position(Kind.RAY_BARRIER, where, None, "report", stack=frames)
    # A collective in flight with no frame named for it: launched from C++ (DDP's reducer inside
    # backward) or async and waited on elsewhere. A rank with one in flight entered it and waits.
    if pending:
        return _in_collective(facts, where, pending[0].op, pending[0], frames, pending)
    p2p = [c for c in record.in_flight() if c.p2p] if record is not None else []
    if p2p:
        return Position(Kind.COLLECTIVE, where, None, p2p[0].op, stack=frames)
    return Position(Kind.ELSEWHERE, where, inner, stack=frames)


def _in_collective(
    facts: RankFacts,
    where: Frame | None,
    op: str,
    now: Collective | None,
    frames: tuple[Frame, ...],
    pending: tuple[Collective, ...],
) -> Position:
    if now is None:
        return Position(Kind.COLLECTIVE, where, None, op, stack=frames)
    record = facts.evidence.flight if facts.evidence is not None else None
    status = record.group(now.pg) if record is not None else None
    label = group_label(now.pg, status.desc if status is not None else "")
    return Position(Kind.COLLECTIVE, where, None, op, now.seq, now.pg, frames, label, pending)
