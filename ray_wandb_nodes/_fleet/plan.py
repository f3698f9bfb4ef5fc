"""What the fleet does next, decided from plain data (a pure function, tested from a table).

The fleet thread gathers what it knows (the node loggers it has and the runs each hosts,
what every run wants, the alive nodes, the runs whose offline data is being collected) and
carries out the plan this returns; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from .._config.values import NodeSelection
from .cap import choose_members, priority
from .nodes import select_nodes

OBSERVER_SUFFIX = "--observer"


def observer_key(run_id: str) -> str:
    """The key (and offline run id) of a run's observer writers: see ``cap``."""
    return f"{run_id}{OBSERVER_SUFFIX}"


def run_of(key: str) -> tuple[str, bool]:
    """The run id a writer key belongs to, and whether it is an observer's."""
    if key.endswith(OBSERVER_SUFFIX):
        return key[: -len(OBSERVER_SUFFIX)], True
    return key, False


@dataclass(frozen=True)
class RunWants:
    """One run's wish for node writers: its node selection and nodes, less the primary's own."""

    run_id: str
    selection: NodeSelection  # WORKERS: the nodes in `nodes`; CLUSTER: every alive node
    nodes: frozenset[str]
    covered_node: str | None = None  # the primary samples this node itself
    # At most this many node writers join the run (None: no cap); the others are observers.
    cap: int | None = None
    kinds: Mapping[str, str] = field(default_factory=dict)  # node -> hardware shape
    ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    stragglers: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    start: tuple[str, ...] = ()  # nodes that get a logger actor
    lost: tuple[str, ...] = ()  # loggers whose node is gone: cleaned up, nothing to finish there
    finish: tuple[tuple[str, str], ...] = ()  # (node, run): writers of runs that no longer use the node
    add: tuple[tuple[str, str], ...] = ()  # (node, run): writers to start, on new loggers too
    # (run, members, observer nodes) of each run past its cap
    capped: tuple[tuple[str, int, frozenset[str]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.start or self.lost or self.finish or self.add)


def wanted_writers(
    wants: Iterable[RunWants],
    alive: Collection[str],
    loggers: Mapping[str, Collection[str]] | None = None,
    capped: list[tuple[str, int, frozenset[str]]] | None = None,
) -> dict[str, set[str]]:
    """node id -> the writer keys wanted there: a run's id where its writer joins it, its
    :func:`observer_key` past its cap (``loggers``: who hosts what now, to keep members put)."""
    wanted: dict[str, set[str]] = {}
    alive_map = dict.fromkeys(alive, True)
    for want in wants:
        nodes = select_nodes(want.selection, want.nodes, alive_map, want.covered_node)
        if want.cap is None or len(nodes) <= want.cap:
            for node_id in nodes:
                wanted.setdefault(node_id, set()).add(want.run_id)
            continue
        current = {n for n, runs in (loggers or {}).items() if want.run_id in runs}
        order = priority(nodes, kinds=want.kinds, ranks=want.ranks, stragglers=want.stragglers)
        chosen = choose_members(nodes, current, want.cap, order, want.stragglers, want.kinds)
        for node_id in chosen.members:
            wanted.setdefault(node_id, set()).add(want.run_id)
        for node_id in chosen.observers:
            wanted.setdefault(node_id, set()).add(observer_key(want.run_id))
        if capped is not None:
            capped.append((want.run_id, len(chosen.members), chosen.observers))
    return wanted


def plan(
    loggers: Mapping[str, Collection[str]],
    wants: Iterable[RunWants],
    alive: Collection[str],
    collecting: Mapping[str, Collection[str]],
) -> Plan:
    """The next step, from ``loggers`` (node id -> run ids its logger hosts), the runs' ``wants``,
    the ``alive`` node ids and ``collecting`` (run id -> nodes whose offline data of that run is
    being brought over: no new writer of that run there until it is, as a restarted Tune trial
    keeps its run id and would reuse the folder).

    A logger on a dead node is lost; a logger's writer of a run that no longer wants its node
    finishes (the logger stays for other runs); an alive node that a run wants gets a logger if
    it has none, and a writer of that run.
    """
    alive_set = set(alive)
    capped: list[tuple[str, int, frozenset[str]]] = []
    wanted = wanted_writers(wants, alive_set, loggers, capped)
    lost = sorted(node_id for node_id in loggers if node_id not in alive_set)
    finish = sorted(
        (node_id, run_id)
        for node_id, runs in loggers.items()
        if node_id in alive_set
        for run_id in set(runs) - wanted.get(node_id, set())
    )
    start = sorted(node_id for node_id in wanted if node_id not in loggers)
    add = sorted(
        (node_id, run_id)
        for node_id, runs in wanted.items()
        for run_id in runs
        if (node_id not in loggers or run_id not in loggers[node_id])
        and node_id not in collecting.get(run_of(run_id)[0], ())
    )
    return Plan(start=tuple(start), lost=tuple(lost), finish=tuple(finish), add=tuple(add), capped=tuple(capped))
