"""A hung attempt's stopped ranks ended (``on_hang="restart"``), so that Ray Train's failure
handling restarts it from its last checkpoint: each node told the processes judged, every node
asked at once and waited for together (bounded), the controller's own node ended here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._hang import EndAnswer, RankProcess, RankProgress, end_ranks
from .._warn import Warner, describe

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun

END_TIMEOUT_S = 10.0  # every node's answer to an end (a control call: answered while its writers are busy)


def end_hung_ranks(
    target: WatchedRun,
    pool: LoggerPool,
    placed: Mapping[str, tuple[int, ...]],
    judged: Mapping[int, RankProgress],
    ranks: tuple[int, ...],
    why: str,
    warner: Warner,
) -> bool:
    """End ``ranks`` of the run's current attempt (``why`` is the error they raise); False where
    no ranks are armed (none judged). ``placed``: node id -> the ranks there.

    Each node is told the attempt (its folder) and each rank's process as it was ``judged`` (pid
    and start time): it ends those and refuses anything else, so an end that arrives late (past
    ``END_TIMEOUT_S``, when this stops waiting) never ends a later attempt's ranks or another
    job's. Every node is asked at once."""
    key = target.attempt
    if key is None:
        return False
    named: dict[str, list[RankProcess]] = {}
    for node_id, on_node in placed.items():
        mine = [judged[r] for r in on_node if r in ranks and r in judged]
        if mine:
            named[node_id] = [RankProcess(p.rank, p.pid, p.proc_start) for p in mine]
    pending: dict[Any, tuple[str, list[RankProcess]]] = {}
    for node_id, processes in named.items():
        try:
            if node_id == target.covered_node:
                _refused(end_ranks(key, processes, why), node_id, warner)
            elif (handle := pool.get(node_id)) is not None:
                pending[handle.actor.end_ranks.remote(key, processes, why)] = (node_id, processes)
        except Exception as e:  # noqa: BLE001
            warner.warn(f"hang-end:{node_id}", f"could not end the hung ranks {_ranks(processes)} ({describe(e)})")
    _await_ends(pending, warner)
    return True


def _ranks(processes: list[RankProcess]) -> str:
    return ", ".join(str(p.rank) for p in processes)


def _refused(answer: EndAnswer, node_id: str, warner: Warner) -> None:
    if answer.refused:
        warner.warn(
            f"hang-end-refused:{node_id}:{answer.refused}",
            f"hung rank(s) {', '.join(map(str, answer.refused))} were not ended: their process is no longer "
            "the one judged (it ended, or the attempt did)",
        )


def _await_ends(pending: dict[Any, tuple[str, list[RankProcess]]], warner: Warner) -> None:
    """Every node's answer to its end, waited for together (bounded: ``END_TIMEOUT_S``)."""
    if not pending:
        return
    import ray

    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=END_TIMEOUT_S)
    for ref, (node_id, processes) in pending.items():
        try:
            if ref not in ready:
                raise TimeoutError(f"no answer in {END_TIMEOUT_S:.0f} s")
            _refused(ray.get(ref), node_id, warner)
        except Exception as e:  # noqa: BLE001
            warner.warn(f"hang-end:{node_id}", f"could not end the hung ranks {_ranks(processes)} ({describe(e)})")
