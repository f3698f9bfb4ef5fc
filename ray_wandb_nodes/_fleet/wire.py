"""What crosses between the driver side and a node's logger actor, defined once: the logger's
status (the answer to every ping, join and finish), and the ranks' console of a run there
(:class:`ConsoleRanks` at each worker-group start, :class:`ConsoleEnd` at each attempt's end).
The status rides every ping, so it stays small: a slotted frozen dataclass, pickled as one
tuple, with each writer's summary (``_health``'s :class:`~ray_wandb_nodes._health.NodeSummary`),
what kept its reader from reading, and, in a finish's answer, each finished writer's last
summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._console import ConsolePlan, RankProcess
from .._egress import Egress
from .._failure import RankMemory
from .._hang import RankProgress
from .._health import NodeSummary, ReadProblem
from .._steps import RankSteps


@dataclass(frozen=True, slots=True)
class LoggerStatus:
    """A ``NodeLogger``'s state, as its ``status()`` reports it."""

    pid: int
    """Its process: a new pid is a restarted logger."""
    node_id: str
    """The Ray node it runs on."""
    hostname: str = ""
    """Its node's hostname."""
    restarted: bool = False
    """Whether Ray restarted its actor (its writers are gone)."""
    runs: tuple[str, ...] = ()
    """The writer keys (run ids, observer keys) it hosts now: joined, or joining."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Each writer's label."""
    logged: Mapping[str, int] = field(default_factory=dict)
    """History rows each standalone writer logged."""
    errors: Mapping[str, str] = field(default_factory=dict)
    """A writer that failed (to join, log, finish), and why."""
    summaries: Mapping[str, NodeSummary] = field(default_factory=dict)
    """Each writer's latest summary of its samples, by writer key."""
    problems: Mapping[str, tuple[ReadProblem, ...]] = field(default_factory=dict)
    """A writer whose samples or transaction log could not be read, and why (empty: none)."""
    progress: Mapping[str, tuple[RankProgress, ...]] = field(default_factory=dict)
    """The train ranks' progress on this node by attempt key (the folders it watches), read off their
    beacons (ages on this node's clock)."""
    steps: Mapping[str, tuple[RankSteps, ...]] = field(default_factory=dict)
    """The train ranks' step anatomy on this node by attempt key: each rank's running totals, read
    off its beacon slot's region with its progress (durations and counts on the rank's own clock)."""
    final: Mapping[str, NodeSummary] = field(default_factory=dict)
    """Each writer this call finished, by writer key: its last summary, read after its finish,
    with the integer GPU series of its transaction log's last, partial block (the run's final
    judgement; a finish's answer only)."""
    warnings: Mapping[str, str] = field(default_factory=dict)
    """What the logger's writers warned of (a checkpoint left out of its artifact), by key: said
    once on the driver side."""
    egress: Mapping[str, Egress] = field(default_factory=dict)
    """Each online writer's way to W&B (direct, through the relay, or offline), by writer key, as
    the checks before its join found it; a writer not checked yet (or offline by the run's own
    mode) is not here."""
    ranks_memory: Mapping[str, tuple[RankMemory, ...]] = field(default_factory=dict)
    """The train ranks' resident memory on this node by attempt key (first, last and peak of the
    node's looks): what says which rank grew where Ray's memory monitor then kills this logger
    too (a failure's facts asked of it never come)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (LoggerStatus, tuple(getattr(self, name) for name in LoggerStatus.__slots__))

    @property
    def summary(self) -> NodeSummary | None:
        """The node's latest summary, from any of its writers."""
        return next(iter(self.summaries.values()), None)


@dataclass(frozen=True)
class ConsoleRanks:
    """A run's train ranks on one node now and their processes (the worker group's, or a replaced
    replica group's), with the run's console budget: the node's logger follows their stdout and
    stderr files into the run (``_console.ConsoleTailer``). Ranks it followed before and not named
    here ended with their attempt."""

    run_id: str
    ranks: tuple[RankProcess, ...]
    plan: ConsolePlan


@dataclass(frozen=True)
class ConsoleEnd:
    """A run's attempt ended (its worker group shuts down): its ranks' last lines go to the run when
    it ``failed`` (see ``_console.budget``). ``dead``: (rank, lines) of the failure's dead ranks on
    this node, the first named first, each with its lines from the run's pool: theirs go first."""

    run_id: str
    failed: bool
    dead: tuple[tuple[int, int], ...] = ()


def merged_steps(
    before: Mapping[str, tuple[RankSteps, ...]], brought: Mapping[str, tuple[RankSteps, ...]]
) -> dict[str, tuple[RankSteps, ...]]:
    """A status's step points after the last status's of the same attempts: a node's points are
    taken by whichever status asks (a hang's refresh between two pings too), so the last ones are
    kept until the fleet has fed them (``steps.feed_steps`` feeds a point once: those already fed
    are passed over), at most as many again as the new."""
    return {key: (before.get(key, ())[-len(points) :] if points else ()) + points for key, points in brought.items()}
