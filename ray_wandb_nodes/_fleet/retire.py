"""One run's end, step by step: its writers finish and the console of the fleet's own node ends
(each bounded), then the run's final judgement of its nodes (each finished writer's last summary),
then its owner's ``then``, then its offline runs are brought over. The fleet thread advances
every retirement on each tick."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .._health import NodeSummary
from .._warn import Warner, describe
from .collect import CollectJob, OfflineCollection
from .commands import Retire
from .egress import sync_into
from .plan import run_of
from .pool import LoggerHandle, LoggerPool
from .targets import RunTarget


class ConsoleEnding(Protocol):
    """A console tailer asked to finish (``_console.ConsoleTailer``)."""

    def wait_finished(self, timeout: float) -> bool: ...


@dataclass
class Retirement:
    run_id: str
    refs: dict[Any, LoggerHandle]  # status ref of each finishing writer -> its logger
    deadline: float
    timeout: float
    then: Callable[[], None] | None
    writers_done: threading.Event  # set once `then` ran (or the retirement gave up)
    job: CollectJob | None = None  # offline: what to bring over once the writers are done
    collecting: bool = False
    # The run's final judgement, given each node's last summary (node id ->), before ``then``.
    judge: Callable[[dict[str, NodeSummary]], None] | None = None
    # The console of the ranks on the fleet's own node, asked to end: its last lines reach the
    # primary's queue before ``then`` (its ``wait_finished(0)``, asked on each step, never waited
    # on), or ``console_until`` (monotonic) passes.
    console: ConsoleEnding | None = None
    console_until: float = 0.0

    def _console_pending(self) -> bool:
        return self.console is not None and time.monotonic() < self.console_until and not self.console.wait_finished(0)

    def wake_on_each_finish(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` (on a Ray thread) as each writer's finish returns, so that the fleet
        thread advances this end at once instead of on its next poll."""
        for ref in self.refs:
            if hasattr(ref, "future"):  # a Ray ObjectRef (simulated refs have none)
                ref.future().add_done_callback(lambda _: wake())

    def advance(self, pool: LoggerPool, collection: OfflineCollection, warner: Warner, final: bool) -> bool:
        """One step of the run's end; True while it has more to do (``final``: stop waiting)."""
        if self.collecting:  # writers finished; their offline runs are on their way
            assert self.job is not None
            if self.job.running and not final:
                return True
            collection.end(self.job)
            return False
        answered = pool.answered(list(self.refs)) if self.refs else set()
        not_done = [ref for ref in self.refs if ref not in answered]
        if ((not_done and time.monotonic() < self.deadline) or self._console_pending()) and not final:
            return True
        last: dict[str, NodeSummary] = {}  # node id -> its writer's last summary of this run
        for ref in self.refs.keys() & answered:
            handle = self.refs[ref]
            status = pool.check_status(handle, ref, self.run_id)
            for key, summary in status.final.items() if status is not None else ():
                if run_of(key)[0] == self.run_id:
                    last[handle.node.node_id] = summary
        if not_done:
            labels = ", ".join(sorted(self.refs[ref].node.label for ref in not_done))
            warner.warn(
                f"node-finish-timeout:{self.run_id}",
                f"node writer(s) {labels} of the W&B run {self.run_id} did not finish within {self.timeout:.0f}s; "
                "their last samples may be missing",
            )
        try:
            if self.judge is not None:  # before the primary finishes: what it says goes in the run
                self.judge(last)
        except Exception as e:  # noqa: BLE001
            warner.warn(f"final-health:{self.run_id}", f"judging the nodes of {self.run_id} failed ({describe(e)})")
        try:
            if self.then is not None:
                self.then()
        except Exception as e:  # noqa: BLE001
            warner.warn(f"retire:{self.run_id}", f"finishing the W&B run {self.run_id} failed ({describe(e)})")
        self.writers_done.set()
        if self.job is not None and self.job.sources:
            if final:
                collection.end(self.job)
                return False
            collection.start(self.job, self.timeout)
            self.collecting = True
            return True
        return False


def advance_all(
    retirements: list[Retirement], pool: LoggerPool, collection: OfflineCollection, warner: Warner, final: bool
) -> list[Retirement]:
    """Advance each retirement one step; those with more to do. One run's failing end is one
    warning and ends there: it never holds the others'."""
    still: list[Retirement] = []
    for r in retirements:
        try:
            more = r.advance(pool, collection, warner, final)
        except Exception as e:  # noqa: BLE001 - one run's end must not hold the others'
            warner.warn(f"retire:{r.run_id}", f"ending the W&B run {r.run_id} failed ({describe(e)})")
            more = False
        if more:
            still.append(r)
        else:
            r.writers_done.set()
    return still


def retire(
    run_id: str,
    target: RunTarget | None,
    pool: LoggerPool,
    collection: OfflineCollection,
    warner: Warner,
    how: Retire,
    judge: Callable[[dict[str, NodeSummary]], None] | None = None,
) -> Retirement:
    """Start retiring ``run_id``: finish its writers (its observers too) with ``exit_code``, then
    ``judge`` each node's last summary, and for an offline run, start collecting what its nodes
    wrote, as ``how`` says."""
    timeout, then, exit_code, writers_done = how.timeout, how.then, how.exit_code, how.done
    refs = {
        pool.finish_writer(h.node.node_id, key, exit_code): h
        for h in pool.handles()
        for key in list(h.runs)
        if run_of(key)[0] == run_id
    }
    r = Retirement(run_id, refs, time.monotonic() + timeout, timeout, then, writers_done, judge=judge)
    if target is not None and target.index is not None:
        r.job = collection.job(run_id, target.index, target.role, target.storage, pool.handles())
        try:
            target.index.update(worker_nodes=sorted(target.nodes))
        except OSError as e:
            warner.warn("offline-index", f"the offline index could not be written ({describe(e)})")
    elif target is not None and target.fallback is not None:  # online, with nodes that had no route to W&B
        r.job = collection.job(run_id, target.fallback, target.role, None, pool.handles(), sync=sync_into(target))
    return r
