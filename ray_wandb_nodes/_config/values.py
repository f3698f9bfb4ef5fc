"""The values of options that are more than a plain type: each parsed once, when the callback is
built (a clear ``ValueError`` naming the option, the value and what is allowed), into a value the
rest of the package reads without asking again.

An option with a closed set of values is an enum here: its members' values are what a user
writes (the callbacks' signatures show them as a ``Literal``, see :func:`literal`), and the code
asks a member what it implies instead of comparing strings. ``offline_transfer``'s
``Transfer`` lives with the offline runs it routes (``offline/storage.py``, a layer below): this
module is imported by the hang core inside every train worker, which loads nothing of ``offline``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "AUTO",
    "ConsoleMode",
    "EgressMode",
    "HangTimeout",
    "Mode",
    "NodeSelection",
    "OnHang",
    "RankMetrics",
    "RunsPer",
    "StragglerMode",
    "Strategy",
    "literal",
    "parse_hang_timeout",
    "spellings",
]

AUTO = "auto"


def spellings(choices: type[Enum]) -> tuple[str, ...]:
    """How a user writes each member of ``choices``, in its order."""
    return tuple(str(member.value) for member in choices)


def literal(choices: type[Enum]) -> str:
    """``choices`` as a signature's annotation: ``Literal["a", "b"]`` (as ruff formats it)."""
    return f"Literal[{', '.join(json.dumps(s) for s in spellings(choices))}]"


class Mode(Enum):
    """``mode``, resolved (the option, else ``WANDB_MODE``, else online): where the runs go."""

    ONLINE = "online"  # to W&B; the writers of one run share it (wandb's shared mode)
    OFFLINE = "offline"  # an offline run per writer, brought to one folder on the driver side
    DISABLED = "disabled"  # nothing at all: no writer, no actor, no thread

    @property
    def logs(self) -> bool:
        """Whether the callback does anything."""
        return self is not Mode.DISABLED


class RunsPer(Enum):
    """The runs of a strategy without a primary, each written by a node's logger actor."""

    NODE = "node"  # one run per node, logging the lowest rank on the node
    RANK = "rank"  # one run per rank, logging that rank and sampling its GPUs


class EgressMode(Enum):
    """``egress``: how node writers reach W&B (see ``_egress``)."""

    DIRECT = "direct"  # each from its own node; one without a route writes offline, synced in at the end
    RELAY = "relay"  # one without a route sends live through a relay on the controller's node


class Strategy(Enum):
    """``strategy``: which W&B runs a Train run makes. Each member says what it implies, and the
    run's code asks it (a table of them is in ``_wandb/strategies.py``)."""

    SHARED = "shared"
    MAIN = "main"
    NODE = "node"
    ALL = "all"

    @property
    def primary(self) -> bool:
        """One run for the job, created and owned by a primary writer on the Train controller:
        its history is the ranks' reports as ``rank_metrics`` says, its system metrics the
        controller's node's (and the node writers', with :attr:`node_writers`)."""
        return self.runs_per is None

    @property
    def node_writers(self) -> bool:
        """Every other node the run selects (``nodes``, up to ``max_node_writers``) gets a writer
        that joins the primary's run for its system metrics, started before the workers are placed."""
        return self is Strategy.SHARED

    @property
    def runs_per(self) -> RunsPer | None:
        """The runs of their own, grouped, one a node or one a rank; None: the primary's one run."""
        return {Strategy.NODE: RunsPer.NODE, Strategy.ALL: RunsPer.RANK}.get(self)

    @property
    def watches_hangs(self) -> bool:
        """Whether ``hang_timeout_s`` applies: the ranks' progress beacons are read on their nodes
        by the node writers' loggers, which only this strategy has on every node of the run."""
        return self.node_writers


class RankMetrics(Enum):
    """``rank_metrics``: what the primary's run logs of each report."""

    RANK0 = "rank0"  # rank 0's keys
    REDUCE = "reduce"  # mean, min, max, std, argmax and argmin rank of every numeric key
    ALL = "all"  # every rank's keys, as rank_<r>/key

    @property
    def every_rank(self) -> bool:
        """Whether a row is built from every rank's report, not rank 0's alone."""
        return self is not RankMetrics.RANK0


class ConsoleMode(Enum):
    """``rank_console``: what a shared run's Logs tab holds of what its ranks print (their stdout
    and stderr, read by each node's logger from the files Ray keeps; see ``_console.budget``)."""

    RANK0 = "rank0"  # rank 0's lines live, and every rank's last lines when an attempt fails
    ALL = "all"  # every rank's lines live, an equal share of the run's lines each
    FAILURES = "failures"  # only every rank's last lines when an attempt fails
    OFF = "off"  # none


class NodeSelection(Enum):
    """``nodes``: which nodes a run's node writers sample."""

    WORKERS = "workers"  # the nodes hosting its train workers (Train) or its trial (Tune)
    CLUSTER = "cluster"  # every alive node, new ones included


class StragglerMode(Enum):
    """``straggler_mode`` (and each health rule's direction): which way a value is better."""

    MAX = "max"  # higher is better (throughput, GPU utilisation)
    MIN = "min"  # lower is better (step time)

    @property
    def higher_is_better(self) -> bool:
        return self is StragglerMode.MAX


class OnHang(Enum):
    """``on_hang``: what a hang does past its alert, table and stacks."""

    ALERT = "alert"  # nothing more
    RESTART = "restart"  # the hung attempt is ended, so that FailureConfig restarts it

    @property
    def ends_attempt(self) -> bool:
        return self is OnHang.RESTART


@dataclass(frozen=True)
class HangTimeout:
    """A validated ``hang_timeout_s``: off (``None``), ``"auto"``, or a fixed number of seconds."""

    seconds: float | None = None
    auto: bool = False

    @property
    def enabled(self) -> bool:
        return self.auto or self.seconds is not None


def parse_hang_timeout(value: object) -> HangTimeout:
    """``hang_timeout_s`` as given by a user; a clear ``ValueError`` for anything else."""
    if value is None:
        return HangTimeout()
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return HangTimeout(auto=True)
        raise ValueError(
            f'hang_timeout_s={value!r}: expected a number of seconds > 0, "auto" (follow the job\'s cadence) '
            "or None (off)"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f'hang_timeout_s={value!r}: expected a number of seconds > 0, "auto" (follow the job\'s cadence) '
            "or None (off)"
        )
    return HangTimeout(seconds=float(value))
