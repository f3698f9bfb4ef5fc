"""What naming a failed attempt's cause costs the fleet thread at 1,000 to 64,000 failed ranks:
the table of per-rank failures, the choice of the cause and the alert, side by side with an
earlier commit's code on the same inputs.

    python -m bench.failure_choose [--ranks 1000 8000 64000] [--rounds 3] [--compare REF]
                                   [--old-max 8000] [--json bench/results/failure_choose.json]

In one process, no Ray, no W&B: the code a run uses on the fleet thread (``_failure.rank_failures``,
``choose``, ``failure_notice``), on inputs built from the plugin's own types, 8 ranks a node:

- ``config``: one config error on every rank at step 0: each rank's own record of a ``KeyError``
  (its traceback's text, its frame, its moment on its node's clock) and Ray's poll with every
  rank's error;
- ``waiters``: every rank but one timed out in ``all_reduce`` behind one rank's death: the
  waiters' records are the real gloo record of ``tests/support/crash_evidence/raise.json`` (rank
  0's, its traceback in c10d; each text made its own by its first frame's line, so that none is
  read as another's: real gloo timeouts are alike, and read once), Ray's poll saw the death
  (``ActorDiedError``) and the waiters running; the dead rank's node found its process gone (its
  window on the node's clock);
- ``lost``: every rank's node lost (N/8 nodes): Ray's poll has every rank's ``ActorDiedError``
  ("its node has died"), and no node answers;
- ``stuck``: every rank but one timed out in gloo's ``all_reduce`` #10 waiting for the one alive
  in its data loader: the waiters' records of their raise (at #10, each text its own as above),
  the stuck rank's record of Ray's stop (at #9, its stack), Ray's poll with every waiter's error
  and the stuck rank running. Its ``stuck_ms`` is the search for the rank they waited for
  (``_failure.waited_for``; 0 on code without it).

Each figure is the median over ``--rounds`` rounds, in milliseconds: the table, the choice, the
notice, and their total. ``--compare REF`` runs the same script on the code of commit ``REF``
(``git archive`` of ``ray_wandb_nodes``, in a process of its own) up to ``--old-max`` ranks (the
old choice is quadratic: 64,000 ranks would take it many minutes) and prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = ("config", "waiters", "lost", "stuck")
PER_NODE = 8
ROOT = Path(__file__).resolve().parents[1]
NODE_DIED = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\nThe actor died "
             "because its node has died. Node Id: {node}\n\tthe actor's node was terminated unexpectedly: health "
             "check failed due to missing too many heartbeats")  # fmt: skip
KILLED = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
          "detail: Worker unexpectedly exits with a connection error code 2. End of file.")  # fmt: skip
STUCK_STACK = (
    '  File "/job/train.py", line 60, in train_loop\n    batch = next_shard()\n'
    '  File "/job/data.py", line 88, in next_shard\n    shard = fs.read(path)\n'
)
CONFIG_TRACEBACK = (
    'Traceback (most recent call last):\n  File "/job/train.py", line 41, in train_loop\n'
    '    lr = config["lr"]\n         ~~~~~~^^^^^^\nKeyError: \'lr\'\n'
)  # fmt: skip


def inputs(shape: str, ranks: int) -> dict[str, Any]:
    """``rank_failures``' arguments for ``shape`` at ``ranks`` failed ranks."""
    from ray_wandb_nodes._failure import Gone, NodeFacts, RankPlace, RankRecord, RayPoll, RayRankError, RecordKind
    from ray_wandb_nodes._failure.facts import UserFrame

    def node(rank: int) -> str:
        return f"node-{rank // PER_NODE}"

    places = [RankPlace(r, node(r), (str(r % PER_NODE),), 10_000 + r) for r in range(ranks)]
    by_node: dict[str, list[Any]] = {}
    if shape == "config":
        frame = UserFrame("/job/train.py", 41, "train_loop", 'lr = config["lr"]')
        for r in range(ranks):
            record = RankRecord(r, 10_000 + r, RecordKind.RAISED, 5_000_000 + r, 0.0, "KeyError", "'lr'",
                                CONFIG_TRACEBACK, frame)  # fmt: skip
            by_node.setdefault(node(r), []).append(record)
        errors = tuple(RayRankError(r, "KeyError", "'lr'", CONFIG_TRACEBACK) for r in range(ranks))
        nodes = {n: NodeFacts(tuple(rs), (), 0, 40.0) for n, rs in by_node.items()}
        return {"places": places, "poll": RayPoll(errors), "nodes": nodes, "lost": ()}
    if shape == "waiters":
        raised = json.loads((ROOT / "tests/support/crash_evidence/raise.json").read_text())
        real = next(r for r in raised["records"] if r["rank"] == 0)
        dead = ranks // 2 + 3
        gone: dict[str, tuple[Any, ...]] = {node(dead): (Gone(dead, 10_000 + dead, 1_000, 2_000, 0),)}
        for r in range(ranks):
            if r != dead:
                # Each text its own (its first frame's line): none read as another's, the worst case.
                text = real["traceback"].replace(", line 37,", f", line {37 + r},", 1)
                data = {**real, "rank": r, "pid": 10_000 + r, "mono_ns": 9_000 + r, "traceback": text}
                record = RankRecord.from_json(json.dumps(data))
                by_node.setdefault(node(r), []).append(record)
        nodes = {
            n: NodeFacts(tuple(by_node.get(n, ())), gone.get(n, ()), 0, 40.0) for n in {node(r) for r in range(ranks)}
        }
        poll = RayPoll(
            (RayRankError(dead, "ActorDiedError", KILLED, died=True),),
            running=tuple(r for r in range(ranks) if r != dead),
        )
        return {"places": places, "poll": poll, "nodes": nodes, "lost": ()}
    if shape == "stuck":
        raised = json.loads((ROOT / "tests/support/crash_evidence/raise.json").read_text())
        real = next(r for r in raised["records"] if r["rank"] == 0)
        stuck = ranks // 2 + 3
        timeout = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 1800000ms for recv operation"
        for r in range(ranks):
            if r == stuck:
                record = RankRecord(r, 10_000 + r, RecordKind.STOPPED, 9_000 + r, 0.0, traceback=STUCK_STACK,
                                    frame=UserFrame("/job/data.py", 88, "next_shard", "shard = fs.read(path)"),
                                    groups=(("0", 9),))  # fmt: skip
            else:
                text = real["traceback"].replace(", line 37,", f", line {37 + r},", 1)
                data = {**real, "rank": r, "pid": 10_000 + r, "mono_ns": 9_000 + r, "traceback": text,
                        "message": timeout, "groups": [["0", 10]]}  # fmt: skip
                record = RankRecord.from_json(json.dumps(data))
            by_node.setdefault(node(r), []).append(record)
        nodes = {n: NodeFacts(tuple(rs), (), 0, 40.0) for n, rs in by_node.items()}
        errors = tuple(RayRankError(r, "RuntimeError", timeout, real["traceback"]) for r in range(ranks) if r != stuck)
        return {"places": places, "poll": RayPoll(errors, running=(stuck,)), "nodes": nodes, "lost": ()}
    errors = tuple(RayRankError(r, "ActorDiedError", NODE_DIED.format(node=node(r)), died=True) for r in range(ranks))
    return {"places": places, "poll": RayPoll(errors), "nodes": {}, "lost": sorted({node(r) for r in range(ranks)})}


def measure(shape: str, ranks: int, rounds: int) -> dict[str, Any]:
    from ray_wandb_nodes._failure import choose, failure_notice, rank_failures

    try:
        from ray_wandb_nodes._failure import waited_for
    except ImportError:  # an earlier commit's code: no search for the rank the others waited for
        waited_for = None

    args = inputs(shape, ranks)
    names = ("table_ms", "stuck_ms", "choose_ms", "notice_ms", "total_ms")
    stages: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        t0 = time.perf_counter()
        failures = rank_failures(args["places"], args["poll"], args["nodes"], args["lost"])
        t1 = time.perf_counter()
        waited = None
        if waited_for is not None:
            failures, waited = waited_for(failures, args["places"], args["nodes"])
        ts = time.perf_counter()
        verdict = choose(failures)
        t2 = time.perf_counter()
        notice = failure_notice(verdict, waited=waited) if waited is not None else failure_notice(verdict)
        t3 = time.perf_counter()
        for name, value in zip(stages, (t1 - t0, ts - t1, t2 - ts, t3 - t2, t3 - t0), strict=True):
            stages[name].append(value * 1000)
    figures: dict[str, Any] = {name: round(statistics.median(values), 2) for name, values in stages.items()}
    first = verdict.first
    figures.update(shape=shape, ranks=ranks, causes=len(verdict.causes), consequences=len(verdict.consequences))
    figures.update(title=notice.title, text_chars=len(notice.text), cause_ranks=len(first.ranks) if first else 0)
    return figures


def run_here(shapes: list[str], sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    return [measure(shape, n, rounds if n < 64_000 else max(1, rounds // 3)) for n in sizes for shape in shapes]


def run_old(ref: str, shapes: list[str], sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """This script on commit ``ref``'s ``ray_wandb_nodes``, in a process of its own."""
    with tempfile.TemporaryDirectory(prefix="rwn-old-code-") as directory:
        archive = subprocess.run(["git", "archive", ref, "ray_wandb_nodes"], cwd=ROOT, check=True, capture_output=True)
        tar = Path(directory) / "code.tar"
        tar.write_bytes(archive.stdout)
        with tarfile.open(tar) as t:
            t.extractall(directory, filter="data")
        env = {**os.environ, "PYTHONPATH": directory}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--here", "--rounds", str(rounds),
               "--shapes", *shapes, "--ranks", *map(str, sizes)]  # fmt: skip
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=directory)
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1000, 8000, 64000])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", default=None, help="a commit whose code to time side by side (e.g. main)")
    parser.add_argument("--old-max", type=int, default=8000, help="the most ranks the old code is timed at")
    parser.add_argument("--here", action="store_true", help="print the rows as one JSON line (for --compare)")
    parser.add_argument("--json", default="bench/results/failure_choose.json")
    args = parser.parse_args(argv)
    if args.here:
        rows = run_here(args.shapes, args.ranks, args.rounds)
        print(json.dumps(rows))
        return rows
    rows = run_here(args.shapes, args.ranks, args.rounds)
    old: dict[tuple[str, int], dict[str, Any]] = {}
    if args.compare:
        sizes = [n for n in args.ranks if n <= args.old_max]
        old = {(r["shape"], r["ranks"]): r for r in run_old(args.compare, args.shapes, sizes, args.rounds)}
    head = f"{'shape':8} {'ranks':>6} {'table':>9} {'stuck':>9} {'choose':>9} {'notice':>9} {'total ms':>9}"
    print(head + (f" | {'old total':>10} {'old choose':>10} {'speed-up':>8}" if old else "") + "  causes/consequences")
    for row in rows:
        line = (f"{row['shape']:8} {row['ranks']:>6} {row['table_ms']:>9.1f} {row['stuck_ms']:>9.1f} "
                f"{row['choose_ms']:>9.1f} {row['notice_ms']:>9.1f} {row['total_ms']:>9.1f}")  # fmt: skip
        before = old.get((row["shape"], row["ranks"]))
        if old:
            line += (f" | {before['total_ms']:>10.1f} {before['choose_ms']:>10.1f} "
                     f"{before['total_ms'] / row['total_ms']:>7.1f}x" if before else f" | {'not run':>10}")  # fmt: skip
        print(line + f"  {row['causes']}/{row['consequences']}  {row['title'][:60]}")
        if before:
            row["old"] = before
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"compare": args.compare, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
