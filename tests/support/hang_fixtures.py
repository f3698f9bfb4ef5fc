"""Real hang evidence captured by ``python -m tests.support.hang_capture`` (files under
``tests/support/hang_evidence/``), loaded as the verdict gets it; and a rank's process that writes
its slot, for the tests of a node's folders and watch."""

from __future__ import annotations

import json
import pickle
import subprocess
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ray_wandb_nodes._hang.beacon import Phase, RankProgress
from ray_wandb_nodes._hang.dumps import evidence_from_dumps
from ray_wandb_nodes._hang.position import RankFacts
from tests.support.child import python_child

CAPTURES = Path(__file__).resolve().parent / "hang_evidence"


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
    dumps = {k: filled_ring(r["dump_thread"], earlier) if earlier and r["dump_thread"] else r["dump_thread"]
             for k, r in records.items()}  # fmt: skip
    out = []
    for rank in range(ranks):
        key, age = (2, 90.0) if rank == stuck else (0, 85.0)
        r = records[key]
        progress = RankProgress(rank, 10_000 + rank, r["reports"], r["steps"], True, age, Phase.RUNNING, age, 0.05,
                                12)  # fmt: skip
        # Parsed for each rank, as its node does (a full ring: 12 ms a rank on this machine).
        evidence = evidence_from_dumps(rank, 10_000 + rank, r["training_ident"], r["faulthandler"], dumps[key])
        out.append(RankFacts(progress, evidence, node=f"node-{rank // per_node}", gpus=(str(rank % per_node),)))
    return out


@dataclass
class SimRun:
    """A run of nodes of ranks as the fleet's ``HangWatch`` sees it: its target, the logger pool
    (handles with each node's ranks' progress as its pings brought it) and each node's answer
    to ``hang_evidence``, pickled as it crosses from the node (``ask`` unpickles it, as
    ``ray.get`` would on the driver)."""

    target: Any
    pool: Any
    answers: dict[int, bytes]  # actor (the node's index) -> its pickled answer
    unpickle_s: list[float] = field(default_factory=list)

    def ask(self, actors: list[Any], _key: str, _ranks: list[list[int]]) -> list[Any]:
        start = time.perf_counter()
        out = [pickle.loads(self.answers[a]) for a in actors]
        self.unpickle_s.append(time.perf_counter() - start)
        return out


class SimPool:
    def __init__(self, handles: dict[str, Any]) -> None:
        self.handles = handles

    def get(self, node_id: str) -> Any:
        return self.handles.get(node_id)

    def answered(self, refs: list[Any]) -> set[Any]:
        """Pings out of turn: none here (every node's readings are fresh)."""
        return set()


def sim_run(mode: str, nodes: int, per_node: int = 8, earlier: int = 0) -> SimRun:
    """``nodes`` nodes of ``per_node`` ranks from :func:`many` (one rank stuck, in the middle)."""
    run_id = f"sim-{mode}-{nodes}"
    attempt = f"{run_id}.a1.5eed5eed"  # the ranks' attempt: the key of their progress in each ping
    facts = many(mode, nodes * per_node, stuck=nodes * per_node // 2 + 3, per_node=per_node, earlier=earlier)
    ranks: dict[str, tuple[int, ...]] = {}
    handles: dict[str, Any] = {}
    answers: dict[int, bytes] = {}
    for n in range(nodes):
        node_id = f"{n:056x}"
        mine = facts[n * per_node : (n + 1) * per_node]
        ranks[node_id] = tuple(f.progress.rank for f in mine)
        answers[n] = pickle.dumps(tuple((f.progress, f.evidence) for f in mine), protocol=pickle.HIGHEST_PROTOCOL)
        handles[node_id] = SimpleNamespace(
            actor=n,
            node=SimpleNamespace(label=mine[0].node),
            progress={attempt: tuple(f.progress for f in mine)},
            progress_at=time.monotonic(),  # the pool's clock (HangWatch's default): fresh ages
        )
    target = SimpleNamespace(
        run_id=run_id,
        attempt=attempt,
        ranks=ranks,
        rank_gpus={f.progress.rank: f.gpus for f in facts},
        covered_node=None,
        health=None,  # no nodes table
        primary=SimpleNamespace(spec=SimpleNamespace(label="driver")),
    )
    return SimRun(target, SimPool(handles), answers)


def rank_process(folder: Path, rank: int, armed: bool = False) -> AbstractContextManager[subprocess.Popen[str]]:
    """A process that writes ``rank``'s slot in ``folder`` (armed: faulthandler and the dump thread
    too) and lives until the block ends or the test kills it."""
    code = (
        "import sys\nfrom pathlib import Path\nfrom ray_wandb_nodes._hang.beacon import Beacon\n"
        "from ray_wandb_nodes._hang.evidence import arm\n"
        f"b = Beacon(Path({str(folder)!r}), {rank})\n"
        + (f"arm(Path({str(folder)!r}), {rank}, b)\n" if armed else "")
        + "print('ready', flush=True)\nsys.stdin.read()"
    )
    return python_child(code)


def files_of(folder: Path, pid: int) -> list[str]:
    """The names of the files of process ``pid`` in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if f".{pid}." in p.name)
