"""One W&B run's lifecycle: start, workers placed, report, finish.

The Ray adapters (``train.py``; ``tune.py`` later) translate hooks into these calls. The
session owns the primary writer and the node fleet and keeps the order the run's state
needs: the primary creates the run before any node writer joins, and at the end node
writers finish before the primary sends the final state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._fleet import NodeFleet
from ._metrics import jsonable
from ._nodes import NodeInfo
from ._options import Options
from ._primary import PrimaryWriter
from ._secrets import CapturedEnv
from ._warn import Warner
from ._writers import primary_spec


@dataclass(frozen=True)
class RankPlacement:
    """Where one train worker runs (from the worker group's metadata)."""

    rank: int
    node_id: str
    hostname: str


class RunSession:
    def __init__(
        self,
        options: Options,
        env: CapturedEnv,
        *,
        run_id: str,
        display_name: str | None,
        group: str | None,
        config: Mapping[str, Any],
        primary_node: NodeInfo,
        default_dir: str | None,
        warner: Warner,
    ) -> None:
        self.options = options
        self.mode = options.mode or "online"
        self.primary_node = primary_node
        self._warner = warner
        spec = primary_spec(
            options,
            env,
            mode=self.mode,
            run_id=run_id,
            label=primary_node.label,
            display_name=display_name,
            group=group,
            config=jsonable(dict(config)),
            default_dir=default_dir,
        )
        self.primary = PrimaryWriter(spec, excludes=options.excludes, warner=warner)
        self.fleet = NodeFleet(
            selection=options.nodes,
            primary_node_id=primary_node.node_id,
            primary=self.primary,
            init_timeout_s=options.init_timeout_s,
            warner=warner,
        )
        self._finished = False

    @property
    def run_id(self) -> str:
        return self.primary.spec.run_id

    def start(self) -> None:
        self.primary.start()
        self.fleet.start()

    def workers_placed(self, placements: Sequence[RankPlacement]) -> None:
        """A worker group (re)started: the fleet follows its nodes; the run config records them."""
        self.fleet.set_worker_nodes(p.node_id for p in placements)
        nodes: dict[str, list[int]] = {}
        for p in placements:
            nodes.setdefault(NodeInfo(p.node_id, p.hostname, "").label, []).append(p.rank)
        self.primary.update_config({"ray_train": {"world_size": len(placements), "ranks_by_node": nodes}})

    def report(self, metrics: Mapping[str, Any]) -> None:
        self.primary.log(metrics)

    def finish(self, exit_code: int, timeout: float | None = None) -> None:
        """Node writers first (bounded), then the primary with ``exit_code``; idempotent."""
        if self._finished:
            return
        self._finished = True
        timeout = self.options.finish_timeout_s if timeout is None else timeout
        self.fleet.finish(timeout)
        self.primary.finish(exit_code, timeout)
