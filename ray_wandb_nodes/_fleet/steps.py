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
from .._steps import RankSteps, decode

if TYPE_CHECKING:
    from .nodes import NodeInfo
    from .pool import LoggerPool
    from .targets import SharedTarget


def feed_steps(target: SharedTarget, pool: LoggerPool, known: Mapping[str, NodeInfo], root: Path | None = None) -> None:
    """Hand ``target``'s monitor every rank's points (its node's last ping's: several a rank, each
        at the steps it covers; the primary's own node's: read now) and where each rank of the current
        attempt runs (on the fleet thread, each check): the ranks of the run's own placement, or those
        a Train run inside a Tune trial published (its hang watch's). The work is each placed rank once,
    and each ping's points once (a 1,000-node fleet brings 64 nodes' a tick)."""
    health, key = target.health, target.attempt
    if health is None or key is None:
        return
    relayed = target.hangs is not None and target.hangs.ranks is not None
    placed = target.hangs.ranks if relayed and target.hangs is not None else target.ranks
    if not placed or not target.ready:
        return
    points: list[RankSteps] = []
    at: dict[int, RankAt] = {}
    for node_id, ranks in placed.items():
        if node_id == target.covered_node:
            label = target.primary.spec.label
            slots = read_slots(run_dir(key, root))
            seen = [RankSteps(s.rank, t, s.pid) for s in slots if (t := decode(s.extension)) is not None]
        else:
            handle = pool.get(node_id)
            info = handle.node if handle is not None else known.get(node_id)
            label = info.label if info is not None else node_id[:12]
            brought = handle.steps.get(key, ()) if handle is not None else ()
            fed, target.steps_fed[node_id] = target.steps_fed.get(node_id), (key, brought)
            seen = [] if fed is not None and fed[0] == key and fed[1] is brought else list(brought)
        mine = set(ranks)
        at.update((rank, RankAt(node_id, label)) for rank in ranks)
        points += (s for s in seen if s.rank in mine)
    health.rank_steps(points, at, gpus=not relayed, attempt=key)
