"""The driver side's handle of one node's ``NodeLogger`` actor: the actor and its placement
group, the writers it hosts, and what its last ping brought (its node's samples, its ranks'
progress, steps and memory); the pool owns them, on the fleet thread."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._failure import RankMemory
from .._hang import RankProgress
from .._health import NodeSummary
from .._steps import RankSteps
from .nodes import NodeInfo
from .wire import ConsoleRanks


@dataclass
class LoggerHandle:
    """The driver side's handle of one node's ``NodeLogger`` actor."""

    node: NodeInfo
    actor: Any
    pg: Any  # its placement group (one bundle, on its node)
    runs: set[str] = field(default_factory=set)
    ping: Any = None  # an outstanding status() call
    pinged: float = 0.0
    pid: int | None = None  # of the logger's process, to notice a restart
    summary: NodeSummary | None = None  # its node's latest samples, as the last ping brought
    # Each writer's latest samples by run id (a Tune trial's writer samples its own processes).
    summaries: dict[str, NodeSummary] = field(default_factory=dict)
    # The train ranks' progress on its node by attempt key (their beacons), as the last ping brought.
    progress: Mapping[str, tuple[RankProgress, ...]] = field(default_factory=dict)
    progress_at: float = 0.0  # when it came (the pool's clock): its ages are that old
    # The train ranks' step totals on its node by attempt key (their beacons' regions), as the last ping brought.
    steps: Mapping[str, tuple[RankSteps, ...]] = field(default_factory=dict)
    # The train ranks' memory on its node by attempt key, as the last ping brought (a failure's
    # facts where the logger is gone: Ray's memory monitor may kill it with the rank).
    ranks_memory: Mapping[str, tuple[RankMemory, ...]] = field(default_factory=dict)
    warm: bool = False  # started ahead of the train workers' placement, with no writer yet
    ping_runs: frozenset[str] = frozenset()  # its writers joined when the last ping was sent
    # The attempt folders it was asked to watch (key -> the ranks there), as sent (see watches.py).
    watching: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # The ranks whose console it follows for each run (run id ->), as sent (see consoles.py).
    consoles: dict[str, ConsoleRanks] = field(default_factory=dict)
