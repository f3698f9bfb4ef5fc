"""The fleet's side of failures: one run's failed attempts (as the Train controller's hooks, a Tune
trial's, or the hand-off saw them) joined with every node's facts of its ranks (their own records,
their processes gone, the cgroup's OOM kills, the node's memory), the first death chosen
(``_failure.choose``) and the notice handed to the run's primary; and, after a retry, the attempt
that recovered. Runs on the fleet thread: the controller's event loop only hands over a value.

Each failed attempt asks the nodes of its ranks at once (a control call: answered while a writer is
busy) and is decided once every node has answered or ``FACTS_TIMEOUT_S`` passed (a lost node's
logger never answers: its ranks are judged from Ray's account and the node's loss). Attempts and
recoveries are told in the order they came, one at a time; the run's end decides what is left
(bounded by the same timeout) before its primary finishes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._failure import (
    FailedAttempt,
    FailureNotice,
    FailureSummary,
    NodeFacts,
    RankMemory,
    choose,
    failure_notice,
    rank_failures,
    recovered_notice,
    waited_for,
)
from .._warn import Warner, describe

if TYPE_CHECKING:
    from .hangs import HangWatch
    from .pool import LoggerPool
    from .watched import WatchedRun

FACTS_TIMEOUT_S = 5.0  # every node's facts of a failed attempt, asked at once
_WAIT_STEP_S = 0.05

LocalFacts = Callable[[str, Sequence[int]], NodeFacts]  # the fleet's own node: (attempt key, ranks) -> its facts


@dataclass
class _Asked:
    """One failed attempt's questions to its nodes: the calls in flight, each node's label."""

    refs: dict[Any, str]  # call -> node label
    facts: dict[str, NodeFacts]  # node label -> its answer (the fleet's own node: at once)
    deadline: float
    memory: dict[str, float] = field(default_factory=dict)  # node label -> its last memory sample (a lost node's)
    ranks_memory: dict[str, tuple[RankMemory, ...]] = field(default_factory=dict)  # ... its ranks', as last pinged


@dataclass
class FailureWatch:
    """One run's failures on the fleet thread (every field is its own; the hooks send commands).
    It lives as long as the run, across Ray Train's attempts."""

    clock: Callable[[], float] = time.monotonic
    last: FailureSummary | None = None  # the last failed attempt's, for its recovery's notice
    fed: int = 0  # the events taken from a Train run inside a Tune trial (its hand-off's list), so far
    _queue: collections.deque[FailedAttempt | int] = field(default_factory=collections.deque)
    _asked: _Asked | None = None

    @property
    def busy(self) -> bool:
        """A failed attempt or a recovery waits to be told."""
        return bool(self._queue)

    def failed(self, failed: FailedAttempt) -> None:
        self._queue.append(failed)

    def recovered(self, attempt: int) -> None:
        """``attempt`` reported after a failed one (told after that one's notice)."""
        self._queue.append(attempt)

    def step(
        self,
        target: WatchedRun,
        pool: LoggerPool,
        warner: Warner,
        local: LocalFacts | None = None,
        alive: Collection[str] | None = None,
        final: bool = False,
        hangs: HangWatch | None = None,
    ) -> None:
        """Tell what is due, in order: a failed attempt once its nodes answered (or their time
        ran out; with ``final``, the run's end, waited for up to that time), a recovery after it.
        ``alive``: the alive nodes' ids (a node of the attempt not among them was lost); ``hangs``:
        the run's hang watch, whose verdict on the attempt (where a hang came first) says who the
        others waited for."""
        while self._queue:
            head = self._queue[0]
            if isinstance(head, int):
                self._queue.popleft()
                if self.last is not None and not self.last.recovered and self.last.attempt < head:
                    notice = recovered_notice(head, self.last)
                    self.last = notice.summary
                    self._tell(target, notice, warner)
                continue
            if head.trial and target.relayed_ranks:  # a Train run inside the trial names its own failures
                self._queue.popleft()
                continue
            if self._asked is None:
                self._asked = self._ask(head, target, pool, local, warner)
            if not self._answered(pool, wait=final):
                return
            asked, self._asked = self._asked, None
            self._queue.popleft()
            labels = _labels(head, target, pool)
            lost = [] if alive is None else [label for n, label in labels.items() if n not in alive]
            places = [replace(p, node=labels[n]) for n, p in head.places]
            facts = self._facts(asked, pool, warner)
            failures = rank_failures(places, head.poll, facts, lost)
            hang = hangs.view(head.key) if hangs is not None else None
            failures, waited = waited_for(failures, places, facts, hang)
            notice = failure_notice(choose(failures), head.attempt, head.max_failures, head.retrying, waited)
            self.last = notice.summary
            self._tell(target, notice, warner)

    def _ask(
        self, failed: FailedAttempt, target: WatchedRun, pool: LoggerPool, local: LocalFacts | None, warner: Warner
    ) -> _Asked:
        asked = _Asked({}, {}, self.clock() + FACTS_TIMEOUT_S)
        if failed.key is None:
            return asked
        labels = _labels(failed, target, pool)
        for node_id, ranks in failed.by_node().items():
            try:
                if node_id == target.covered_node:
                    if local is not None:
                        asked.facts[labels[node_id]] = local(failed.key, ranks)
                elif (handle := pool.get(node_id)) is not None:
                    if (last := handle.summaries.get(target.run_id)) is not None and last.mem is not None:
                        asked.memory[labels[node_id]] = last.mem  # what a node that never answers leaves
                    asked.ranks_memory[labels[node_id]] = handle.ranks_memory.get(failed.key, ())
                    asked.refs[handle.actor.failure_facts.remote(failed.key, ranks)] = labels[node_id]
            except Exception as e:  # noqa: BLE001 - that node's ranks are judged from Ray's account
                warner.warn(f"failure-facts:{node_id}", f"could not ask {labels[node_id]} how its ranks ended "
                            f"({describe(e)})")  # fmt: skip
        return asked

    def _answered(self, pool: LoggerPool, wait: bool) -> bool:
        asked = self._asked
        assert asked is not None
        while True:
            if not asked.refs or len(pool.answered(list(asked.refs))) == len(asked.refs):
                return True
            if self.clock() >= asked.deadline:
                return True
            if not wait:
                return False
            time.sleep(_WAIT_STEP_S)

    def _facts(self, asked: _Asked, pool: LoggerPool, warner: Warner) -> dict[str, NodeFacts]:
        facts = dict(asked.facts)
        answered = pool.answered(list(asked.refs)) if asked.refs else set()
        for ref, label in asked.refs.items():
            if ref not in answered:  # no answer in time: a lost node, or a logger stuck
                if label in asked.memory or asked.ranks_memory.get(label):
                    facts[label] = _last_pinged(asked, label)
                continue
            try:
                facts[label] = pool.result(ref)
            except Exception as e:  # noqa: BLE001 - its logger died: its ranks are judged from Ray's account
                warner.warn(f"failure-facts:{label}", f"{label} could not say how its ranks ended ({describe(e)})")
                if label in asked.memory or asked.ranks_memory.get(label):
                    facts[label] = _last_pinged(asked, label)  # its last pings' memory, node and ranks
        return facts

    def _tell(self, target: WatchedRun, notice: FailureNotice, warner: Warner) -> None:
        if notice.level == "ERROR":
            warner.warn(f"failure:{target.run_id}:{notice.attempt}", f"training failed: {notice.title}")
        target.primary.failure(notice)


def _last_pinged(asked: _Asked, label: str) -> NodeFacts:
    """What a node whose logger never answered left in its last pings: its memory and its ranks'."""
    return NodeFacts((), (), None, asked.memory.get(label), ranks_memory=asked.ranks_memory.get(label, ()))


def _labels(failed: FailedAttempt, target: WatchedRun, pool: LoggerPool) -> dict[str, str]:
    """Each node's label as the run's writers carry it (a Train run inside a Tune trial labelled
    its nodes in its own process), else as the attempt named it (a node whose logger is gone)."""
    labels = failed.labels()
    for node_id in labels:
        if node_id == target.covered_node:
            labels[node_id] = target.primary.spec.label
        elif (handle := pool.get(node_id)) is not None:
            labels[node_id] = handle.node.label
    return labels
