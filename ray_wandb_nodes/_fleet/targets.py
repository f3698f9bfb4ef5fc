"""Run targets: one W&B run's wish for writers on the nodes it uses, in two kinds.

A :class:`SharedTarget` is a shared run whose primary (on the driver side) creates it; the
fleet's node writers join it once it exists. A :class:`StandaloneTarget` is a run of the node
or all strategy: its one writer, in its node's logger, is the run, and the fleet routes its
history rows there. The fleet thread alone changes a target once it has it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .._console import ConsoleMode
from .._wandb.writers import WriterSpec, node_spec, observer_spec, offline_index
from .._warn import Warner, describe
from ..offline.index import OfflineIndex
from ..offline.storage import StorageSpot
from .nodes import NodeInfo
from .plan import RunWants, run_of
from .run_writer import RunWriter

if TYPE_CHECKING:
    from .._gpu_ids import RankGpus
    from .._health import HealthMonitor
    from .hangs import HangWatch


@dataclass(kw_only=True)
class RunTarget:
    selection: str = "workers"  # "workers": the nodes in `nodes`; "cluster": every alive node
    nodes: set[str] = field(default_factory=set)
    # The node whose metrics the primary reports itself (no node writer there); None when
    # the primary samples no system metrics, or there is no primary.
    covered_node: str | None = None
    # Offline mode: the run's folder index; the fleet brings every node writer's run there,
    # through ``storage`` when set (the run's storage), else through Ray.
    storage: StorageSpot | None = None
    index: OfflineIndex | None = None
    # True once the run exists and writers may join it (the fleet thread sets it).
    ready: bool = False
    # The train ranks on each node (node id -> ranks), as the run's last placement said.
    ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Each rank's GPU ids as Ray names them ("0", "GPU-<uuid>"), as the last placement said.
    rank_gpus: dict[int, RankGpus] = field(default_factory=dict)
    # Each rank's process id, as the last placement said (its console's files carry it).
    pids: dict[int, int] = field(default_factory=dict)
    # The key of the ranks' current attempt (``_hang.attempt_key``: their folder of beacons and
    # dumps on each node), as the last placement said; None: no ranks armed for hangs.
    attempt: str | None = None
    role: ClassVar[str] = "node"  # the role of its writers on the nodes

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
    # Read on every plan for more nodes (a Train run inside a Tune trial publishes its own).
    extra_nodes: Callable[[], Iterable[str]] | None = None
    spec_for: Callable[[RunWriter, NodeInfo], WriterSpec] | None = None
    # The run's node health (table, straggler and node-lost alerts); None: none kept.
    health: HealthMonitor | None = None
    health_fed: object = None  # what its monitor last learnt of the run's nodes (see health.feed)
    # The run's hang detection; None: off (``hang_timeout_s=None``, or a run with no train ranks).
    hangs: HangWatch | None = None
    # What the run's Logs tab holds of its ranks' console (``rank_console``; see _console.budget).
    console: ConsoleMode = "off"

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = self.primary.index

    @property
    def run_id(self) -> str:
        return self.primary.spec.run_id

    def spec(self, node: NodeInfo) -> WriterSpec:
        p = self.primary
        if self.spec_for is not None:
            return self.spec_for(p, node)
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
    role: ClassVar[str] = "run"

    def __post_init__(self) -> None:
        if self.index is None:
            self.index = offline_index(self.writer)

    @property
    def run_id(self) -> str:
        return self.writer.run_id

    def spec(self, node: NodeInfo) -> WriterSpec:
        return self.writer


def extra_nodes(target: RunTarget, warner: Warner) -> Iterable[str]:
    """More nodes a shared run learns from elsewhere (a Train run inside a Tune trial publishes
    its own), read on every plan; none when they cannot be read (one warning)."""
    if not isinstance(target, SharedTarget) or target.extra_nodes is None:
        return ()
    try:
        return set(target.extra_nodes())
    except Exception as e:  # noqa: BLE001
        warner.warn(f"extra-nodes:{type(e).__name__}", f"could not read more nodes ({describe(e)})")
        return ()


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
