"""What a hang watch asks of the nodes (``_fleet/hangs.py``): fresher readings of suspected ranks
(their nodes pinged out of turn), and every rank's evidence, all nodes asked at once and waited for
together (bounded), the controller's own node read here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._gpu_ids import named
from .._hang import DUMPS_TIMEOUT_S, PYSPY_TIMEOUT_S, RankEvidence, RankFacts, RankProgress, rank_evidence

if TYPE_CHECKING:
    from .pool import LoggerPool
    from .watched import WatchedRun

# Every node's answer, waited for together: each node bounds its own dumps (``DUMPS_TIMEOUT_S``);
# past this, a node that has not answered is named in verdict.txt and its ranks are judged from
# their progress alone, so that one stuck logger does not hold the whole hang's alert.
EVIDENCE_TIMEOUT_S = DUMPS_TIMEOUT_S + PYSPY_TIMEOUT_S + 5.0

Evidence = tuple[tuple[RankProgress, RankEvidence], ...]  # a node's answer
Ask = Callable[[list[Any], str, list[list[int]]], list[Evidence | None]]


@dataclass
class Refreshes:
    """Pings out of turn that a watch sends to its suspected ranks' nodes, for fresher readings than
    their last ping's; each answer is taken in as the pool takes a ping's (``check_status``: the
    handle's progress, read now). One a node in flight; one that has not answered within
    ``EVIDENCE_TIMEOUT_S`` (a logger lost, or busy) is given up, and the node may be asked again."""

    asked: dict[str, tuple[Any, Any, float]] = field(default_factory=dict)  # node -> (handle, call, when)
    sent: int = 0

    def ask(self, pool: LoggerPool, node_ids: Iterable[str], now: float) -> None:
        for node_id in node_ids:
            handle = pool.get(node_id)
            if handle is not None and node_id not in self.asked:
                self.asked[node_id] = (handle, handle.actor.status.remote(), now)
                self.sent += 1

    def take(self, pool: LoggerPool, now: float) -> None:
        """The answers in so far, into the pool's handles."""
        if not self.asked:
            return
        answered = pool.answered([ref for _, ref, _ in self.asked.values()])
        for node_id, (handle, ref, sent_at) in list(self.asked.items()):
            current = pool.get(node_id)
            if ref in answered:
                del self.asked[node_id]
                if current is not None and current is handle:  # not a logger replaced since
                    pool.check_status(current, ref)
            elif now - sent_at > EVIDENCE_TIMEOUT_S or current is not handle:
                del self.asked[node_id]


def evidence(
    target: WatchedRun,
    pool: LoggerPool,
    ranks: Mapping[int, tuple[RankProgress, str]],
    ask: Ask,
) -> list[RankFacts]:
    """Every rank's evidence, all nodes asked at once; a rank whose node gave none is judged
    from its progress alone."""
    nodes = sorted({node for _, node in ranks.values()})
    remote = [n for n in nodes if n != target.covered_node and pool.get(n) is not None]
    got: dict[int, tuple[RankProgress, RankEvidence | None]] = {}
    placed: dict[str, list[int]] = {}
    for rank, (_, node) in ranks.items():
        placed.setdefault(node, []).append(rank)
    key = target.attempt or ""  # the attempt's folder (set: the watch found its ranks there)
    actors = [pool.get(n).actor for n in remote]  # type: ignore[union-attr]
    answers = ask(actors, key, [sorted(placed[n]) for n in remote]) if remote else []
    if target.covered_node in nodes:
        answers.append(rank_evidence(key, ranks=sorted(placed[target.covered_node])))
    for answer in answers:
        for progress, given in answer or ():
            got[progress.rank] = (progress, given)
    facts = []
    labels = {n: (pool.get(n).node.label if pool.get(n) else "") for n in nodes}  # type: ignore[union-attr]
    if target.covered_node:
        labels[target.covered_node] = target.primary.spec.label
    for rank, (progress, node) in sorted(ranks.items()):
        now_progress, evidence = got.get(rank, (progress, None))
        facts.append(RankFacts(now_progress, evidence, labels.get(node, ""), named(target.rank_gpus.get(rank, ()))))
    return facts


def ask_loggers(actors: list[Any], key: str, ranks: list[list[int]]) -> list[Evidence | None]:
    """Every node logger asked for its ranks' evidence (of the attempt ``key``) at once, waited for
    together (bounded)."""
    import ray

    refs = [actor.hang_evidence.remote(key, mine) for actor, mine in zip(actors, ranks, strict=True)]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=EVIDENCE_TIMEOUT_S)
    out: list[Evidence | None] = []
    for ref in refs:
        try:
            out.append(ray.get(ref) if ref in ready else None)
        except Exception:  # noqa: BLE001 - that node's ranks are judged from their progress alone
            out.append(None)
    return out
