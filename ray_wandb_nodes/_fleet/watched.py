"""What a run's hang and failure watches read of the run they watch (``hangs``, ``hang_nodes``,
``failures``), as a protocol: where its ranks run and arm, its node covered by the primary, its node
health (the nodes table's progress) and its primary (a hang's or a failure's notice). A shared
run's target (``targets.SharedTarget``) is one; the watches never import the targets that hold it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._gpu_ids import RankGpus
    from .._health import HealthMonitor
    from .run_writer import RunWriter


class WatchedRun(Protocol):
    """A run as its watches read it (on the fleet thread, which owns the run's target)."""

    attempt: str | None  # the key of the folder its current attempt's ranks arm in; None: not armed
    covered_node: str | None  # the node its primary reports itself (its ranks read there, locally)
    ranks: dict[str, tuple[int, ...]]  # node id -> the train ranks there
    relayed_ranks: dict[str, tuple[int, ...]] | None  # a Train run's inside a Tune trial; None: none published
    rank_gpus: dict[int, RankGpus]
    health: HealthMonitor | None
    primary: RunWriter

    @property
    def run_id(self) -> str: ...
