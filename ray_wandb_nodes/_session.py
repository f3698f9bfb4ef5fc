"""One W&B run's lifecycle: start, nodes used, report, finish.

The Ray adapters (``train.py``, ``tune.py``) translate hooks into these calls. The session
pairs the run's primary writer with its target in a node fleet and keeps the order the
run's state needs: the primary creates the run before any node writer joins (the fleet
waits for it), and at the end node writers finish before the primary sends the final state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ._fleet import NodeFleet, RunTarget
from ._primary import PrimaryWriter


class RunSession:
    def __init__(self, primary: PrimaryWriter, fleet: NodeFleet, target: RunTarget, finish_timeout_s: float) -> None:
        self.primary = primary
        self.fleet = fleet
        self.target = target
        self.finish_timeout_s = finish_timeout_s
        self._finishing = False

    @property
    def run_id(self) -> str:
        return self.primary.spec.run_id

    @property
    def finishing(self) -> bool:
        return self._finishing

    def start(self) -> None:
        self.primary.start()
        self.fleet.start()
        self.fleet.add_run(self.target)

    def set_nodes(self, nodes: Iterable[str], covered_node: str | None) -> None:
        self.fleet.set_run_nodes(self.run_id, nodes, covered_node)

    def report(self, metrics: Any) -> None:
        if not self._finishing:
            self.primary.log(metrics)

    def finish(self, exit_code: int, *, wait: bool, timeout: float | None = None) -> None:
        """Node writers first (bounded), then the primary with ``exit_code``; idempotent.

        With ``wait`` it returns once the run is finished or the bounds have passed.
        """
        if self._finishing:
            return
        self._finishing = True
        timeout = self.finish_timeout_s if timeout is None else timeout
        self.fleet.retire_run(self.run_id, timeout, then=lambda: self.primary.request_finish(exit_code))
        if not wait:
            return
        deadline = time.monotonic() + timeout + 5.0
        while not self.primary.done and time.monotonic() < deadline and not self.primary.finish_requested:
            time.sleep(0.02)
        self.primary.request_finish(exit_code)  # idempotent; covers a fleet that could not hand over
        self.primary.wait_done(timeout)
