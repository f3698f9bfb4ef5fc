"""The driver side's part of slow ranks: a run's ranks' step totals gathered into its monitor each
poll, as its node loggers' pings bring them (decoded on each node: ``node_logger.rank_steps``) and
off the beacons of the primary's own node. The attempt's key names the ranks' folder, so a
restarted attempt's ranks are never mixed with the last one's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .._hang import read_slots, run_dir
from .._health import RankAt
from .._steps import RankSteps, StepTotals, decode

if TYPE_CHECKING:
    from .nodes import NodeInfo
    from .pool import LoggerPool
    from .targets import SharedTarget


def feed_steps(target: SharedTarget, pool: LoggerPool, known: Mapping[str, NodeInfo], root: Path | None = None) -> None:
    """Hand ``target``'s monitor every rank's latest totals and where each rank of the current
    attempt runs (on the fleet thread, each check): the ranks of the run's own placement, or those
    a Train run inside a Tune trial published (its hang watch's). The work is each placed rank once."""
    health, key = target.health, target.attempt
    if health is None or key is None:
        return
    relayed = target.hangs is not None and target.hangs.ranks is not None
    placed = target.hangs.ranks if relayed and target.hangs is not None else target.ranks
    if not placed or not target.ready:
        return
    totals: dict[int, StepTotals] = {}
    at: dict[int, RankAt] = {}
    for node_id, ranks in placed.items():
        if node_id == target.covered_node:
            label = target.primary.spec.label
            slots = read_slots(run_dir(key, root))
            seen = [RankSteps(s.rank, t) for s in slots if (t := decode(s.extension)) is not None]
        else:
            handle = pool.get(node_id)
            info = handle.node if handle is not None else known.get(node_id)
            label = info.label if info is not None else node_id[:12]
            seen = list(handle.steps.get(key, ())) if handle is not None else []
        mine = set(ranks)
        at.update((rank, RankAt(node_id, label)) for rank in ranks)
        totals.update((s.rank, s.totals) for s in seen if s.rank in mine)
    health.rank_steps(totals, at, gpus=not relayed)
