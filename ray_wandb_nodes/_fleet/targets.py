"""Run targets: one W&B run's wish for writers on the nodes it uses, in two kinds.

A :class:`SharedTarget` is a shared run whose primary (on the driver side) creates it; the
fleet's node writers join it once it exists. A :class:`StandaloneTarget` is a run of the node
or all strategy: its one writer, in its node's logger, is the run, and the fleet routes its
history rows there.

One owner: a target is built whole on the thread of the hook that opens the run and handed to
the fleet with ``AddRun``; from then on the fleet thread alone reads and changes it. What the
run's hooks (and its primary's thread) learn later reaches it as a command on the fleet's queue
(``SetNodes``, ``RanksFinished``, ``Checkpointed``, ``Located``, ``EndHealth``); what a run learns
from elsewhere (a Train run inside a Tune trial) the fleet thread reads as a :class:`Relayed`
value and applies itself. The one thing the hooks read back is ``wants_report``, an event the
fleet thread sets.

A shared run's state on the fleet's side (its node health, its hang watch, what health last
learnt, ``health_fed``) stays in its target rather than in a record of the fleet's beside it:

- one record per run: a second record keyed by run id would have to be kept in step with the
  targets on every add, replacement (a restarted trial's new target under the same id) and
  retirement, the parallel per-run dicts this package avoids elsewhere;
- the health rules and the hang watch read the run's wish (its ranks, attempt, covered node,
  primary) on every check: in one object, as the ``WatchedRun`` protocol reads it;
- the kind of monitor is the run's choice (a Tune trial's logs its table as the trial runs), so
  the run builds it, before the hand-over, when no other thread has it yet; the fleet could only
  build it from a factory the run gives, which is the same hand-over by another name.

Ownership comes from the hand-over, not from the split: a monitor or hang watch built on the
hook's thread is never touched there after ``AddRun``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from .._config.values import ConsoleMode, NodeSelection
from .._failure import FailureEvent
from .._wandb.writers import Role, WriterSpec, node_spec, observer_spec, offline_index
from .._warn import Warner, describe
from ..offline.index import OfflineIndex
from ..offline.storage import StorageSpot
from .hangs import HangSetting, HangWatch
from .nodes import NodeInfo
from .plan import RunWants, run_of
from .run_writer import RunWriter

if TYPE_CHECKING:
    from .._gpu_ids import RankGpus
    from .._health import HealthMonitor
    from .failures import FailureWatch


class RunProcess(NamedTuple):
    """A run's own process on its node (a Tune trial's, found by its primary's thread): the node
    writer there reports that process's ``proc.*`` series."""

    node_id: str
    pid: int


class HealthFed(NamedTuple):
    """What a run's node health last learnt of its nodes (``health.feed``): it is told them again
    only when one of these changed."""

    nodes: frozenset[str]  # the nodes the monitor judges
    ranks_id: int  # the identity of the target's ``ranks`` (a new placement is a new dict)
    observed: frozenset[str]  # the nodes observed only, past the writer cap
    known: int  # how many nodes the fleet has seen alive
    alive_id: int  # the identity of the fleet's alive nodes (replaced only when they change)


@dataclass(frozen=True)
class Relayed:
    """What a shared run learns from elsewhere than its own hooks, read by the fleet thread on
    every poll (``SharedTarget.relay``): a Train run inside a Tune trial publishes where its ranks
    are, the attempt they armed in, its hang setting, its attempt's state and its failed attempts.
    The fleet thread applies it to the run's target, hang watch and failure watch
    (:func:`relayed_nodes`)."""

    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # node id -> the ranks there
    attempt: str | None = None  # the key of the ranks' attempt (their folder); None: not armed
    hangs: HangSetting | None = None  # how to watch them for hangs; None: not watched (or not yet)
    finished: frozenset[int] = frozenset()  # ranks whose train function returned
    checkpoint_reports: int = 0  # the attempt's reports at its last checkpoint (0: none yet)
    # Its failed attempts and recoveries so far, in order (the run's failure watch takes the new ones).
    failures: tuple[FailureEvent, ...] = ()


@dataclass(kw_only=True)
class RunTarget:
    selection: NodeSelection = NodeSelection.WORKERS  # WORKERS: the nodes in `nodes`; CLUSTER: every alive node
    nodes: set[str] = field(default_factory=set)
    # The node whose metrics the primary reports itself (no node writer there); None when
    # the primary samples no system metrics, or there is no primary.
    covered_node: str | None = None
    # Offline mode: the run's folder index; the fleet brings every node writer's run there,
    # through ``storage`` when set (the run's storage), else through Ray.
    storage: StorageSpot | None = None
    index: OfflineIndex | None = None
    # An online run's nodes without a route to W&B write offline: the folder their runs come to
    # at the run's end, to be synced into it (the fleet makes it as it finds the first such node).
    fallback: OfflineIndex | None = None
    # True once the run exists and writers may join it (the fleet thread sets it).
    ready: bool = False
    # The train ranks on each node (node id -> ranks), as the run's last placement said.
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Each rank's GPU ids as Ray names them ("0", "GPU-<uuid>"), as the last placement said.
    rank_gpus: dict[int, RankGpus] = field(default_factory=dict)
    # Each rank's process id, as the last placement said (its console's files carry it).
    pids: dict[int, int] = field(default_factory=dict)
    # The key of the ranks' current attempt (``_hang.attempt_key``: their folder of records, beacons
    # and dumps on each node), as the last placement said; None: no ranks watched.
    attempt: str | None = None
    role: ClassVar[Role] = Role.NODE  # the role of its writers on the nodes

    @property
    def run_id(self) -> str:
        raise NotImplementedError

    def spec(self, node: NodeInfo) -> WriterSpec:
        """The spec of this run's writer on ``node``."""
        raise NotImplementedError

    # At most this many node writers join the run; None: no cap (see cap.py).
    max_writers: int | None = None

    def wants(
        self,
        extra_nodes: Iterable[str] = (),
        kinds: dict[str, str] | None = None,
        stragglers: frozenset[str] = frozenset(),
    ) -> RunWants:
        nodes = frozenset(self.nodes) | frozenset(extra_nodes)
        return RunWants(
            self.run_id,
            self.selection,
            nodes,
            self.covered_node,
            cap=self.max_writers,
            kinds=kinds or {},
            ranks=self.ranks,
            stragglers=stragglers,
        )


@dataclass(kw_only=True)
class SharedTarget(RunTarget):
    """A shared run: node writers join the run the ``primary`` creates."""

    primary: RunWriter
    # Read by the fleet thread on every plan: what the run learns from elsewhere (a Train run
    # inside a Tune trial publishes its nodes, ranks and hang setting); None: nothing.
    relay: Callable[[], Relayed] | None = None
    # The spec of the run's writer on a node, given the run's own process (None: not located).
    spec_for: Callable[[RunWriter, NodeInfo, RunProcess | None], WriterSpec] | None = None
    # The run's own process on its node (``Located``); None: none, or not found yet.
    process: RunProcess | None = None
    # The run's node health (table, straggler and node-lost alerts); None: none kept.
    health: HealthMonitor | None = None
    health_fed: HealthFed | None = None  # what its monitor last learnt of the run's nodes (see health.feed)
    # Set by the fleet thread while the run's node health waits for its ranks' next report (a
    # node whose ranks have not reported yet); the run's hooks read it to send that report.
    wants_report: threading.Event = field(default_factory=threading.Event)
    # The run's hang detection; None: off (``hang_timeout_s=None``, or a run with no train ranks).
    hangs: HangWatch | None = None
    # What the run's Logs tab holds of its ranks' console (``rank_console``; see _console.budget).
    console: ConsoleMode = ConsoleMode.OFF
    # The run's failures named (a rank's death, its cause and what followed); None: not named.
    failures: FailureWatch | None = None
    # The ranks on each node of a Train run inside a Tune trial (as it published them); None: the run's own.
    relayed_ranks: dict[str, tuple[int, ...]] | None = None
    # Each node's step points last handed to the run's monitor (the ping's tuple, by node id): a
    # ping's points are fed once, not on every check until the next (see steps.feed_steps).
    steps_fed: dict[str, tuple[str, object]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = self.primary.index

    @property
    def run_id(self) -> str:
        return self.primary.spec.run_id

    def spec(self, node: NodeInfo) -> WriterSpec:
        p = self.primary
        if self.spec_for is not None:
            return self.spec_for(p, node, self.process)
        return node_spec(p.spec, label=node.label, entity=p.entity, project=p.project)

    def observer(self, node: NodeInfo, key: str) -> WriterSpec:
        """The spec of an observer of this run on ``node`` (past the writer cap)."""
        return observer_spec(self.primary.spec, key=key, label=node.label)


@dataclass(kw_only=True)
class StandaloneTarget(RunTarget):
    """A run of its own (node and all strategies), written by one writer on its node."""

    writer: WriterSpec
    excludes: tuple[str, ...] = ()
    ready: bool = True  # its writer creates the run
    role: ClassVar[Role] = Role.RUN

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = offline_index(self.writer)

    @property
    def run_id(self) -> str:
        return self.writer.run_id

    def spec(self, node: NodeInfo) -> WriterSpec:
        return self.writer


def relayed_nodes(target: RunTarget, warner: Warner) -> Iterable[str]:
    """On the fleet thread, on every plan (and at the run's end): what a shared run learns from
    elsewhere (a Train run inside a Tune trial publishes it), applied to its target, and the
    nodes it adds; none when it cannot be read (one warning)."""
    if not isinstance(target, SharedTarget) or target.relay is None:
        return ()
    try:
        relayed = target.relay()
    except Exception as e:  # noqa: BLE001
        warner.warn(f"extra-nodes:{type(e).__name__}", f"could not read more nodes ({describe(e)})")
        return ()
    take_relayed(target, relayed)
    return set(relayed.ranks)


def take_relayed(target: SharedTarget, relayed: Relayed) -> None:
    """Apply what the run learnt from elsewhere (on the fleet thread): its ranks and their attempt
    are watched (how they end, hang detection or not); its hang watch is built on the first hang
    setting that comes with ranks, and then follows their ranks, attempt and state; its failure
    watch takes the failed attempts and recoveries it has not taken yet."""
    if relayed.ranks:
        target.relayed_ranks, target.attempt = dict(relayed.ranks), relayed.attempt
    if target.hangs is None and relayed.hangs is not None and relayed.ranks:
        target.hangs = relayed.hangs.watch()
    if target.hangs is not None:
        target.hangs.ranks = dict(relayed.ranks)
        target.hangs.finished, target.hangs.checkpoint_reports = relayed.finished, relayed.checkpoint_reports
        target.attempt = relayed.attempt
    if target.failures is not None and relayed.ranks:
        for event in relayed.failures[target.failures.fed :]:
            if isinstance(event, int):
                target.failures.recovered(event)
            else:
                target.failures.failed(event)
        target.failures.fed = max(target.failures.fed, len(relayed.failures))


def early_nodes(targets: Iterable[RunTarget], alive: Mapping[str, NodeInfo]) -> set[str]:
    """The alive nodes of runs not created yet, to start loggers on ahead (less each primary's
    own node; not for a run past its writer cap, whose members are chosen once it exists): a
    Tune trial's node is known at once, its run exists a second or more later, and a logger's
    start then overlaps that wandb.init instead of the trial's end and the next trial's start."""
    return {
        node_id
        for t in targets
        if not t.ready and (t.max_writers is None or len(t.nodes) <= t.max_writers)
        for node_id in t.nodes - {t.covered_node}
        if node_id in alive
    }


def writer_spec(targets: Mapping[str, RunTarget], key: str, node: NodeInfo) -> WriterSpec | None:
    """The spec of writer ``key`` (a run id, or a run's observer key) on ``node``; None for a run
    that is gone."""
    run_id, observer = run_of(key)
    target = targets.get(run_id)
    if target is None:
        return None
    if observer:
        return target.observer(node, key) if isinstance(target, SharedTarget) else None
    return target.spec(node)
