"""What a run's hang watch reads of the run it watches (``hangs``, ``hang_nodes``), as a protocol:
where its ranks run and arm, its node covered by the primary, its node health (the nodes table's
progress) and its primary (a hang's notice). A shared run's target (``targets.SharedTarget``) is
one; the watch never imports the targets that hold it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._gpu_ids import RankGpus
    from .._health import HealthMonitor
    from .run_writer import RunWriter


class WatchedRun(Protocol):
    """A run as its hang watch reads it (on the fleet thread, which owns the run's target)."""

    attempt: str | None  # the key of the folder its current attempt's ranks arm in; None: not armed
    covered_node: str | None  # the node its primary reports itself (its ranks read there, locally)
    ranks: dict[str, tuple[int, ...]]  # node id -> the train ranks there
    rank_gpus: dict[int, RankGpus]
    health: HealthMonitor | None
    primary: RunWriter

    @property
    def run_id(self) -> str: ...
