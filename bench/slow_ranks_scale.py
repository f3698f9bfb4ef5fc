"""The slow rank at 1,000 nodes: time to name it, false alerts and the judge's CPU, with the
fleet's real ping stagger (``tests/support/fleet_steps``: simulated ranks and nodes; the nodes'
points, the ping turn, ``feed_steps`` and the rank rule real).

    python -m bench.slow_ranks_scale [--nodes 1000] [--ranks 8] [--minutes 10] [--json PATH]

Two runs of the same fleet, side by side: a balanced job of 0.3 s steps for ``--minutes``
simulated minutes (every alert in it is a false one), and the same job with one rank's input
200 ms slower from minute 1 (the time from then to its alert, and whether the alert names that
rank and its input). The fleet pings 64 nodes a tick of 3 s, so each node answers about every
``nodes / 64 * 3`` s (47 s at 1,000). ``judge_cpu_s``: the fleet thread's CPU for the slow-rank
path over the whole run (feeding the points every tick and the windows); ``node_cpu_s``: every
node's reads and takes together (divide by the nodes for one node's share).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from tests.support.fleet_steps import FleetSim, Job

SLOW_FROM_S = 60.0


def one(nodes: int, ranks: int, minutes: float, slow: bool) -> dict[str, Any]:
    world = nodes * ranks
    job = Job(slow_rank=world // 2 + 3, slow_from_s=SLOW_FROM_S) if slow else Job()
    sim = FleetSim(job, nodes, ranks)
    started = time.perf_counter()
    out = sim.run(minutes * 60)
    slow_alerts = [(t, a) for t, a in out.alerts if a.level == "WARN" and a.title.startswith("Slow rank")]
    first = slow_alerts[0] if slow_alerts else None
    return {
        "nodes": nodes,
        "ranks": world,
        "simulated_s": minutes * 60,
        "steps": out.steps,
        "judgements": out.judged,
        "alerts": [f"{t:.0f}s {a.level} {a.title}" for t, a in out.alerts],
        "false_alerts": len(out.alerts)
        if not slow
        else len([a for _, a in out.alerts if str(job.slow_rank) not in a.title]),
        "named_after_s": (first[0] - SLOW_FROM_S) if slow and first else None,
        "named_right": bool(first and f"rank {job.slow_rank} " in first[1].title + " " and "input" in first[1].text),
        "judge_cpu_s": round(out.judge_cpu_s, 2),
        "judge_cpu_share": round(out.judge_cpu_s / (minutes * 60), 4),
        "node_cpu_s_per_node": round(out.node_cpu_s / nodes, 4),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {
        "balanced": one(args.nodes, args.ranks, args.minutes, slow=False),
        "one_slow_rank": one(args.nodes, args.ranks, args.minutes, slow=True),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
