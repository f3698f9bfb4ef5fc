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


def many(mode: str, ranks: int, stuck: int, per_node: int = 8) -> list[RankFacts]:
    """``ranks`` ranks from a capture: each as the captured rank 0 is (in ``python`` and
    ``native``: waiting in all_reduce #5), but ``stuck``, as the captured rank 2 is; ``per_node``
    ranks a node. No progress for 85 s, the stuck rank 90 s."""
    records = {r["rank"]: r for r in capture(mode)}
    out = []
    for rank in range(ranks):
        r, age = (records[2], 90.0) if rank == stuck else (records[0], 85.0)
        progress = RankProgress(rank, 10_000 + rank, r["reports"], r["steps"], True, age, Phase.RUNNING, age, 0.05,
                                12)  # fmt: skip
        evidence = evidence_from_dumps(rank, 10_000 + rank, r["training_ident"], r["faulthandler"], r["dump_thread"])
        out.append(RankFacts(progress, evidence, node=f"node-{rank // per_node}", gpus=(str(rank % per_node),)))
    return out
