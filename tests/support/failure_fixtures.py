"""Real failure evidence, loaded as the decision gets it:

- ``tests/support/crash_evidence/{kill,raise,exit,two}.json``: four ranks over gloo (torch
  2.13) without Ray (``python -m tests.support.crash_world MODE OUT``): each rank's own record
  as the plugin's hook on Ray's ``ThreadRunner`` wrote it, each process's death as watched from
  outside, its exit;
- ``tests/support/crash_evidence/ray-2.60.json``: Ray Train V2's poll on which its controller
  decided, read by ``_ray.failures.poll_of`` (``python -m tests.support.crash_ray_capture``).

The gloo worlds are placed two ranks a node (ranks 0-1 on ``node-0``, 2-3 on ``node-1``), one GPU
a rank; all four ran on one machine, so their monotonic times are one clock, as one node's are.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ray_wandb_nodes._failure import Gone, NodeFacts, RankPlace, RankRecord, RayPoll, RayRankError

EVIDENCE = Path(__file__).resolve().parent / "crash_evidence"
RANK_SCRIPT = Path(__file__).resolve().parent / "crash_rank.py"  # the gloo worlds' ranks


def world(mode: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((EVIDENCE / f"{mode}.json").read_text())
    return data


def node_of(rank: int) -> str:
    return f"node-{rank // 2}"


def places(mode: str, with_pids: bool = True) -> list[RankPlace]:
    data = world(mode)
    pids = {g["rank"]: g["pid"] for g in data["gone"]}
    return [RankPlace(r, node_of(r), (str(r % 2),), pids[r] if with_pids else None) for r in range(data["world"])]


def records(mode: str) -> list[RankRecord]:
    return [RankRecord.from_json(json.dumps(r)) for r in world(mode)["records"]]


def gone(mode: str, before_ns: int | None = None) -> list[Gone]:
    """The processes found gone, those found so by ``before_ns`` where given (what the node's
    logger had seen when it was asked)."""
    out = [Gone(**g) for g in world(mode)["gone"]]
    return [g for g in out if before_ns is None or g.gone_ns <= before_ns]


def nodes(
    mode: str,
    *,
    ranks: set[int] | None = None,
    before_ns: int | None = None,
    oom_kills: dict[str, int] | None = None,
    oom_at_death: dict[int, int] | None = None,
    memory: dict[str, float] | None = None,
) -> dict[str, NodeFacts]:
    """Each node's facts: its ranks' records and gone processes (only ``ranks``' where given);
    ``oom_kills`` counted on a node during the run, ``oom_at_death`` as a rank's process died (the
    captures counted none: an OOM kill is written in)."""
    out = {}
    for node in sorted({node_of(r) for r in range(world(mode)["world"])}):
        mine = [r for r in records(mode) if node_of(r.rank) == node and (ranks is None or r.rank in ranks)]
        dead = [replace(g, oom_kills=(oom_at_death or {}).get(g.rank, g.oom_kills)) for g in gone(mode, before_ns)
                if node_of(g.rank) == node and (ranks is None or g.rank in ranks)]  # fmt: skip
        out[node] = NodeFacts(tuple(mine), tuple(dead), (oom_kills or {}).get(node, 0), (memory or {}).get(node))
    return out


def record_error(mode: str, rank: int) -> RayRankError:
    """Rank ``rank``'s raise as Ray's poll holds it: its type, message and traceback text."""
    r = next(r for r in records(mode) if r.rank == rank)
    return RayRankError(rank, r.error_type, r.message, r.traceback)


def ray_captures() -> dict[str, dict[str, Any]]:
    data = json.loads((EVIDENCE / "ray-2.60.json").read_text())
    return {c["scenario"]: c for c in data}


def ray_poll(scenario: str) -> RayPoll:
    poll = ray_captures()[scenario]["poll"]
    errors = tuple(RayRankError(**{**e, "causes": tuple(e["causes"])}) for e in poll["errors"])
    return RayPoll(errors, tuple(poll["running"]), tuple(poll["unanswered"]))


def ray_places(scenario: str) -> list[RankPlace]:
    """The ranks of a Ray capture, on nodes named by their first 8 hex digits."""
    return [RankPlace(p["rank"], f"node-{p['node'][:8]}", (), p["pid"]) for p in ray_captures()[scenario]["placements"]]


def ray_nodes(scenario: str) -> dict[str, NodeFacts]:
    """Each node's facts in a Ray capture: the records its ranks' hooks wrote (no process watch)."""
    by_rank = {p.rank: p.node for p in ray_places(scenario)}
    records = [RankRecord.from_json(json.dumps(r)) for r in ray_captures()[scenario]["records"]]
    return {node: NodeFacts(tuple(r for r in records if by_rank[r.rank] == node), (), 0)
            for node in sorted(set(by_rank.values()))}  # fmt: skip
