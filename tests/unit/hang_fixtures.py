"""Real hang evidence captured by ``python -m tests.support.hang_capture`` (files under
``tests/support/hang_evidence/``), loaded as the verdict gets it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray_wandb_nodes._hang.beacon import Phase, RankProgress
from ray_wandb_nodes._hang.evidence import evidence_from_dumps
from ray_wandb_nodes._hang.verdict import RankFacts

CAPTURES = Path(__file__).resolve().parents[1] / "support" / "hang_evidence"


def capture(mode: str) -> list[dict[str, Any]]:
    ranks: list[dict[str, Any]] = json.loads((CAPTURES / f"{mode}.json").read_text())["ranks"]
    return ranks


def facts(mode: str, ages: dict[int, float] | None = None) -> list[RankFacts]:
    out = []
    for r in capture(mode):
        age = (ages or {}).get(r["rank"], 30.0)
        progress = RankProgress(r["rank"], 1000 + r["rank"], r["reports"], r["steps"], True, age, Phase.RUNNING,
                                age, 0.05, 12)  # fmt: skip
        evidence = evidence_from_dumps(r["rank"], 1000 + r["rank"], r["training_ident"], r["faulthandler"],
                                       r["dump_thread"])  # fmt: skip
        out.append(RankFacts(progress, evidence, node=f"node-{r['rank'] // 2}", gpus=(str(r["rank"] % 2),)))
    return out


def filled_ring(dump_thread: dict[str, Any], earlier: int) -> dict[str, Any]:
    """A captured dump thread's JSON as it would be ``earlier`` collectives later: the flight
    recorder's ring holds ``earlier`` more completed all_reduces before the captured ones, whose
    sequence numbers (and the group's status) move up by as many."""
    recorder = json.loads(dump_thread["flight_recorder"])
    entries = recorder["entries"]
    before = [{**entries[0], "collective_seq_id": seq, "retired": True} for seq in range(1, earlier + 1)]
    recorder["entries"] = before + [{**e, "collective_seq_id": e["collective_seq_id"] + earlier} for e in entries]
    for status in recorder["pg_status"].values():
        for key in ("last_completed_collective", "last_enqueued_collective"):
            status[key] = str(int(status[key]) + earlier)
    return {**dump_thread, "flight_recorder": json.dumps(recorder)}


def many(mode: str, ranks: int, stuck: int, per_node: int = 8, earlier: int = 0) -> list[RankFacts]:
    """``ranks`` ranks from a capture: each as the captured rank 0 is (in ``python`` and
    ``native``: waiting in all_reduce #5), but ``stuck``, as the captured rank 2 is; ``per_node``
    ranks a node. No progress for 85 s, the stuck rank 90 s. ``earlier``: as many collectives
    later (see :func:`filled_ring`; 1995 fills the plugin's ring of 2,000)."""
    records = {r["rank"]: r for r in capture(mode)}
    dumps = {k: r["dump_thread"] and (filled_ring(r["dump_thread"], earlier) if earlier else r["dump_thread"])
             for k, r in records.items()}  # fmt: skip
    out = []
    for rank in range(ranks):
        key, age = (2, 90.0) if rank == stuck else (0, 85.0)
        r = records[key]
        progress = RankProgress(rank, 10_000 + rank, r["reports"], r["steps"], True, age, Phase.RUNNING, age, 0.05,
                                12)  # fmt: skip
        evidence = evidence_from_dumps(rank, 10_000 + rank, r["training_ident"], r["faulthandler"], dumps[key])
        out.append(RankFacts(progress, evidence, node=f"node-{rank // per_node}", gpus=(str(rank % per_node),)))
    return out
