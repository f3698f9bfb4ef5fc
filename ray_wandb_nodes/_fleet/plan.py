"""What the fleet does next, decided from plain data (a pure function, tested from a table).

The fleet thread gathers what it knows (the node loggers it has and the runs each hosts,
what every run wants, the alive nodes, the runs whose offline data is being collected) and
carries out the plan this returns; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .nodes import select_nodes


@dataclass(frozen=True)
class RunWants:
    """One run's wish for node writers: its node selection and nodes, less the primary's own."""

    run_id: str
    selection: str  # "workers": the nodes in `nodes`; "cluster": every alive node
    nodes: frozenset[str]
    covered_node: str | None = None  # the primary samples this node itself


@dataclass(frozen=True)
class Plan:
    start: tuple[str, ...] = ()  # nodes that get a logger actor
    lost: tuple[str, ...] = ()  # loggers whose node is gone: cleaned up, nothing to finish there
    finish: tuple[tuple[str, str], ...] = ()  # (node, run): writers of runs that no longer use the node
    add: tuple[tuple[str, str], ...] = ()  # (node, run): writers to start, on new loggers too

    def __bool__(self) -> bool:
        return bool(self.start or self.lost or self.finish or self.add)


def wanted_writers(wants: Iterable[RunWants], alive: Collection[str]) -> dict[str, set[str]]:
    """node id -> the run ids that want a writer there."""
    wanted: dict[str, set[str]] = {}
    alive_map = dict.fromkeys(alive, True)
    for want in wants:
        for node_id in select_nodes(want.selection, want.nodes, alive_map, want.covered_node):
            wanted.setdefault(node_id, set()).add(want.run_id)
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
    wanted = wanted_writers(wants, alive_set)
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
        if (node_id not in loggers or run_id not in loggers[node_id]) and node_id not in collecting.get(run_id, ())
    )
    return Plan(start=tuple(start), lost=tuple(lost), finish=tuple(finish), add=tuple(add))
