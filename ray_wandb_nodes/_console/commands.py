"""What the node logger's other threads send the console thread (``tailer.ConsoleTailer``): the
ranks to watch, an attempt's end, the run's end. The thread alone applies them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .budget import ConsolePlan


@dataclass(frozen=True)
class RankProcess:
    """A rank of this node's current attempt and its process (the train worker actor's)."""

    rank: int
    pid: int


@dataclass(frozen=True)
class Watch:
    """The ranks of this node's current attempt; ranks watched before and not here end (failed).
    ``plan``: the run's budget anew (the worker group changed size); what was sent counts still."""

    ranks: tuple[RankProcess, ...]
    plan: ConsolePlan | None = None


@dataclass(frozen=True)
class EndAttempt:
    """The attempt ended (its ranks' processes are gone or going): ``failed`` sends every rank's
    last lines, else only those of ranks whose live share ran out. ``dead``: (rank, lines) of
    the failure's dead ranks, first named first, each with its lines from the run's pool
    (``budget.dead_allowance``): theirs go first (see ``budget``)."""

    failed: bool
    dead: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Finish:
    """The run ends: the attempt ends as :class:`EndAttempt` says, every line is handed to the sink,
    then the thread stops and sets ``done``."""

    failed: bool
    done: threading.Event = field(default_factory=threading.Event, compare=False)


Command = Watch | EndAttempt | Finish
