"""What live node health costs the Train controller, per node and minute.

    python -m bench.health_cost [--nodes 8 64 512 1024] [--gpus 8] [--minutes 3] [--interval 15 3]
                                [--ping-batch N] [--json FILE]

Everything the controller does for node health in one minute, for ``N`` simulated nodes with
``--gpus`` GPUs each, in this one process (no Ray: the Ray call is the same ping the fleet
makes anyway; only its reply grows by the summary):

- 20 pings a node (one per fleet poll of 3 s; with ``--ping-batch N``, as the fleet pings, at
  most N loggers a poll in turn: 64 in the fleet, so past 64 nodes a node's summary comes less
  often than every poll): unpickling each logger's status *with* its
  summary, less the same status without one (what the summary adds to the reply); both built by
  ``tests/support/fakes.py`` from the plugin's own message types;
- feeding each summary to the run's monitor and judging the straggler rule and the GPU rules
  (slow, idle, memory errors, lost: every GPU against the job's others) on every poll
  (``_fleet.health.feed`` and ``publish``, the code the fleet runs). Each summary carries, per
  GPU, the float readings and, as a node's reader does, the integer series of its last 4
  transaction-log blocks (a new block every other poll), and the GPUs' models and UUIDs;
- once a minute the node table and the ``gpus`` table: their rows, a ``wandb.Table`` of each
  and its JSON (what ``run.log`` writes).

Reported: controller CPU (``time.process_time``) per node per minute, for each part. The target
is under 1 ms per node per minute.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import time
from types import SimpleNamespace
from typing import Any

from ray_wandb_nodes._config.values import NodeSelection
from ray_wandb_nodes._fleet import health as fleet_health
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.wire import LoggerStatus
from ray_wandb_nodes._health import COLUMNS, GPU_COLUMNS, HealthMonitor, HealthOptions
from ray_wandb_nodes._wandb.runs import health_table
from tests.support.fakes import busy_node, logger_status

POLLS_PER_MINUTE = 20  # the fleet pings each logger every 3 s
POLL_S = 3.0
SAMPLES_PER_BLOCK = 6  # samples of 8 GPUs a 32 KiB transaction-log block holds (bench/gpu_summary_cost.py)
RECENT_S = 10.0  # a reader's summary carries the blocks it read in the last 10 s


def status(node: int, poll: int, gpus: int, summary: bool, interval: float = 3.0) -> LoggerStatus:
    """A logger's status reply as the fleet receives it (the summary as a node's reader makes it,
    for a writer sampling every ``interval`` seconds: the same summary until the next sample)."""
    node_id = f"{node:056x}"
    if not summary:
        return logger_status(node_id, 1000 + node, ["run-abc"], hostname=f"host{node}")
    sample = int(poll * POLL_S // interval)  # the writer's newest sample at this poll
    per = max(1, round(interval / POLL_S))
    t = 1.8e9 + sample * interval
    block = sample // SAMPLES_PER_BLOCK  # the newest complete transaction-log block
    blocks = [b for b in (block - 1, block) if (sample - b * SAMPLES_PER_BLOCK) * interval <= RECENT_S]
    # as a reader sends them: the log blocks it read in the last 10 s
    spans = [
        (
            1.8e9 + (b * SAMPLES_PER_BLOCK - SAMPLES_PER_BLOCK + 1) * interval,
            1.8e9 + b * SAMPLES_PER_BLOCK * interval,
            SAMPLES_PER_BLOCK,
        )
        for b in blocks
    ]
    rnd = random.Random(node * 7919 + sample)
    s = busy_node(rnd, node, t, t0=t - (per - 1) * POLL_S, seq=sample + 1, gpu_count=gpus, batches=spans)
    return logger_status(node_id, 1000 + node, ["run-abc"], hostname=f"host{node}", summaries={"run-abc": s})


def pinged(n: int, poll: int, batch: int) -> list[int]:
    """The nodes whose replies come at ``poll``: every node, or ``batch`` of them in turn."""
    return list(range(n)) if not batch or batch >= n else [(poll * batch + k) % n for k in range(batch)]


def one_minute(
    n: int, gpus: int, minute: int, state: dict[str, Any], interval: float = 3.0, batch: int = 0
) -> dict[str, float]:
    """One simulated minute; seconds of CPU for each part."""
    pool, target = state["pool"], state["target"]
    polls = [minute * POLLS_PER_MINUTE + p for p in range(POLLS_PER_MINUTE)]
    replies = [
        [
            (
                i,
                pickle.dumps(status(i, poll, gpus, True, interval)),
                pickle.dumps(status(i, poll % POLLS_PER_MINUTE, gpus, False)),
            )
            for i in pinged(n, poll, batch)
        ]
        for poll in polls
    ]
    cpu = {"reply": 0.0, "monitor": 0.0, "table": 0.0}
    for p in range(POLLS_PER_MINUTE):
        batch_replies = replies[p]
        t0 = time.process_time()
        for i, with_summary, _ in batch_replies:
            pool.handles[state["ids"][i]].summaries = {"run-abc": pickle.loads(with_summary).summary}
        t1 = time.process_time()
        for _, _, without in batch_replies:
            pickle.loads(without)
        t2 = time.process_time()
        cpu["reply"] += (t1 - t0) - (t2 - t1)
        state["clock"].now += 3.0
        t3 = time.process_time()
        updated = [state["ids"][i] for i, _, _ in batch_replies]  # the fleet feeds the nodes its pings brought
        fleet_health.feed(target, pool, state["alive"], state["known"], updated)
        fleet_health.publish(target, state["warner"])
        cpu["monitor"] += time.process_time() - t3
    t4 = time.process_time()
    table_json(COLUMNS, target.health.table())
    names = {nid: (f"node-host{i}-{i:06x}", f"host{i}") for i, nid in enumerate(state["ids"])}
    table_json(GPU_COLUMNS, target.health.gpus.rows(names))
    cpu["table"] += time.process_time() - t4
    return cpu


def table_json(columns: list[str], rows: list[list[Any]]) -> str:
    """The table as the primary logs it (``_wandb_io.health_table``), and its JSON."""
    table = health_table(columns, rows)
    return json.dumps({"columns": table.columns, "data": table.data})


def setup(n: int, gpus: int) -> dict[str, Any]:
    class Clock:
        now = 1.8e9

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    ids = [f"{i:056x}" for i in range(n)]
    alive = {nid: NodeInfo(nid, f"host{i}", f"10.0.{i // 250}.{i % 250}") for i, nid in enumerate(ids)}
    handles = {nid: SimpleNamespace(summaries={}) for nid in ids}
    pool = SimpleNamespace(handles=handles, get=handles.get)
    primary = SimpleNamespace(summary=None, alert=lambda a: None, log_health=lambda s, t, g=None: None)
    target = SimpleNamespace(
        run_id="run-abc",
        health=HealthMonitor(HealthOptions(table_every_s=1e9), clock=clock),  # the bench builds the table itself
        nodes=set(ids),
        ranks={nid: tuple(range(gpus * i, gpus * (i + 1))) for i, nid in enumerate(ids)},
        rank_gpus={r: (str(r % gpus),) for r in range(gpus * n)},  # a rank a GPU
        covered_node=None,
        selection=NodeSelection.WORKERS,
        primary=primary,
        ready=True,
        health_fed=None,
        max_writers=None,
    )
    warner = SimpleNamespace(warn=lambda key, msg: None)
    return {
        "pool": pool,
        "target": target,
        "alive": alive,
        "known": alive,
        "ids": ids,
        "clock": clock,
        "warner": warner,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 512, 1024])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument(
        "--interval",
        type=float,
        nargs="+",
        default=[15.0, 3.0],
        help="the writers' sampling interval (15 s: the default; 3 s or less: a new sample every poll)",
    )
    parser.add_argument(
        "--ping-batch",
        type=int,
        default=0,
        help="at most this many loggers' replies a poll, in turn, as the fleet pings (64); 0: every node every poll",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    replies = f"at most {args.ping_batch} replies a poll" if args.ping_batch else "every node"
    pings = f"{POLLS_PER_MINUTE} polls, {replies}"
    print(f"controller CPU for node health, per node per minute ({args.gpus} GPUs a node, {pings})")
    print(f"{'interval':>8} {'nodes':>6} {'summary in reply':>17} {'monitor+rules':>14} {'tables':>8} {'total':>8}")
    for interval in args.interval:
        for n in args.nodes:
            state = setup(n, args.gpus)
            one_minute(n, args.gpus, 0, state, interval, args.ping_batch)  # warm-up
            monitored = len(state["target"].health.table())
            assert monitored == n, f"the monitor holds {monitored} of {n} nodes: the bench would measure nothing"
            parts = {"reply": 0.0, "monitor": 0.0, "table": 0.0}
            for minute in range(1, args.minutes + 1):
                for k, v in one_minute(n, args.gpus, minute, state, interval, args.ping_batch).items():
                    parts[k] += v
            per = {k: max(0.0, v) / args.minutes / n * 1e3 for k, v in parts.items()}  # ms per node per minute
            total = sum(per.values())
            print(
                f"{interval:>7g}s {n:>6} {per['reply']:>14.3f} ms {per['monitor']:>11.3f} ms "
                f"{per['table']:>5.3f} ms {total:>5.3f} ms"
            )
            results.append(
                {
                    "interval_s": interval,
                    "nodes": n,
                    "gpus": args.gpus,
                    "ping_batch": args.ping_batch,
                    "ms_per_node_minute": {**per, "total": total},
                }
            )
    if args.json:
        from bench._harness import write_result

        write_result(args.json, {"bench": "health_cost", "results": results})


if __name__ == "__main__":
    main()
