"""How long taking a hang's evidence takes: 4 real ranks on one node, and the driver side at 64 and
1,000 simulated nodes of 8 ranks.

    python -m bench.hang_evidence [--rounds 5] [--at 4 2004] [--nodes 64 1000] [--earlier 0]
                                  [--modes python native all] [--skip-real] [--json FILE]

**Real ranks** (no Ray): 4 processes of torch.distributed over gloo on this machine, each armed as
a Train worker is (beacon, faulthandler on a signal, the dump thread, the flight recorder;
``tests/support/hang_rank.py``), in a run's beacon folder on this node. Rank 2 stops before step
``--at``'s all_reduce while the others wait in it: in a Python loop (``python``), or in a C call
that holds the GIL (``native``, ``tests/support/gil_holder.c`` built with the system compiler).
At step 2004 every recorder's ring of 2,000 collectives is full. Once they settle, each round
times ``request_dumps`` over the 4 slots (what a node's logger runs when asked:
``rank_evidence``), then ``judge`` and ``hang_notice`` on what it gave.

**Simulated nodes**: the driver side of ``HangWatch`` (``_fleet/hangs.py``, the code a run
uses) from ``check()`` to the notice it delivers, over N nodes of 8 ranks (64 nodes: 512 ranks;
1,000: 8,000). The run's target and the logger pool are stand-ins with the fields HangWatch reads
(``tests/support/hang_fixtures.sim_run``); every rank is past its limit. The nodes' answers are made
from real captured evidence (``tests/support/hang_evidence/*.json``, taken from the ranks above):
every rank waits in an all_reduce as the captured rank 0 does, one is stuck as the captured rank
2 is (``all``: every rank in one function); ``--earlier 1995`` puts 1,995 more collectives before
the captured ones (a full ring), parsed and trimmed as a node does. Each answer is pickled
beforehand (on its node) and unpickled when asked (on the driver, as ``ray.get`` does), so the
driver's deserialisation is in the figure. The nodes' own dumps are not: they run on the nodes in
parallel, each bounded by ``request_dumps``' timeout (3 s; the real figures above), and the
driver waits for them at most ``EVIDENCE_TIMEOUT_S`` (15 s). Reported: the median and max over
rounds of check() to the notice, its stages timed apart on the same inputs (progress, evidence
with the unpickling, judge, hang_notice), the pickled bytes of a node's answer, the notice's
files (count, total bytes) and its alert text.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray_wandb_nodes._fleet.hang_nodes import evidence
from ray_wandb_nodes._fleet.hang_round import gc_paused
from ray_wandb_nodes._fleet.hangs import HangWatch
from ray_wandb_nodes._hang import (
    HangNotice,
    HangTimeout,
    RankFacts,
    hang_notice,
    judge,
    progress_of,
    read_slots,
    request_dumps,
    run_dir,
)
from ray_wandb_nodes._hang.evidence import EvidencePaths
from ray_wandb_nodes._hang.flight import flight_recorder_env
from ray_wandb_nodes._hang.rank import FLIGHT_BUFFER
from ray_wandb_nodes._warn import Warner
from tests.support.hang_fixtures import SimRun, sim_run
from tests.support.hang_world import rank_processes, settled

REPO = Path(__file__).resolve().parents[1]
WORLD, STUCK = 4, 2
RANKS_A_NODE = 8
TIMEOUT = HangTimeout(seconds=60.0)
STAGES = ("progress", "evidence", "judge", "hang_notice")


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(values) * 1e3, "max_ms": max(values) * 1e3}


# -- 4 real ranks ------------------------------------------------------------------------------
@contextmanager
def real_ranks(mode: str, at: int, lib: str = "") -> Iterator[Path]:
    """``WORLD`` rank processes in ``mode`` in a run's beacon folder on this node, with the
    plugin's ring of 2,000 (``hang_rank.py`` keeps a variable that is set); killed by pid."""
    directory = run_dir(f"bench-hang-{uuid.uuid4().hex[:8]}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        with rank_processes(
            directory, mode, WORLD, STUCK, at, lib, {**os.environ, **flight_recorder_env(FLIGHT_BUFFER)}
        ):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def real_case(mode: str, at: int, rounds: int, lib: str = "") -> dict[str, Any]:
    """Settle 4 real ranks in ``mode`` at step ``at``; time the node's evidence and the verdict ``rounds`` times."""
    dumps, judged, noticed = [], [], []
    sentence, answered = "", 0
    with real_ranks(mode, at, lib) as directory:
        settled(directory, WORLD, at, timeout_s=300.0)
        for _ in range(rounds):
            slots = read_slots(directory)
            start = time.perf_counter()
            evidence = request_dumps(slots)
            dumps.append(time.perf_counter() - start)
            now = time.monotonic_ns()
            facts = [RankFacts(progress_of(s, now), e, f"node-{s.rank // 2}", (str(s.rank % 2),))
                     for s, e in zip(slots, evidence, strict=True)]  # fmt: skip
            start = time.perf_counter()
            verdict = judge(facts)
            judged.append(time.perf_counter() - start)
            start = time.perf_counter()
            hang_notice(verdict, facts, 1)
            noticed.append(time.perf_counter() - start)
            sentence = verdict.sentence
            answered = sum(1 for e in evidence if e.python)
        ring = recorder_ring(directory, slots)
    return {
        "mode": mode,
        "step": at,
        "request_dumps": stats_ms(dumps),
        "judge": stats_ms(judged),
        "hang_notice": stats_ms(noticed),
        "python_dumps_answered": answered,
        "recorder_ring": ring,
        "sentence": sentence,
    }


def recorder_ring(directory: Path, slots: list[Any]) -> int:
    """The entries of rank 0's flight recorder as its dump thread wrote them (before the node trims)."""
    slot = next(s for s in slots if s.rank == 0)
    data = json.loads(EvidencePaths.of(directory, 0, slot.pid).python.read_text())
    return len(json.loads(data["flight_recorder"])["entries"]) if data.get("flight_recorder") else 0


def build_gil_lib() -> str:
    """``gil_holder.c`` built with the system compiler (as the tests do); "" without one."""
    from tests.support import clib

    return str(clib.gil_holder()) if clib.compiler() else ""


# -- simulated nodes: the driver side --------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def one_round(run: SimRun, warner: Warner) -> tuple[float, HangNotice, dict[str, float]]:
    """One hang raised: check() to the delivered notice; then its stages apart, on the same inputs."""
    got: list[tuple[float, HangNotice]] = []
    watch = HangWatch(TIMEOUT)
    start = time.perf_counter()
    watch.check(run.target, run.pool, warner, lambda n: got.append((time.perf_counter(), n)), ask=run.ask)
    assert len(got) == 1, "no hang raised"
    stages = {}
    stages["progress"], read = timed(lambda: watch.progress(run.target, run.pool))
    ranks = {rank: (reading.now(), reading.node) for rank, reading in read.items()}
    with gc_paused():  # as check() runs them
        stages["evidence"], facts = timed(lambda: evidence(run.target, run.pool, ranks, run.ask))
        stages["judge"], verdict = timed(lambda: judge(facts))
        stages["hang_notice"], _ = timed(lambda: hang_notice(verdict, facts, 1))
    return got[0][0] - start, got[0][1], stages


def sim_case(nodes: int, mode: str, rounds: int, earlier: int = 0) -> dict[str, Any]:
    """``rounds`` of HangWatch.check() to the notice over ``nodes`` simulated nodes, and its parts."""
    run = sim_run(mode, nodes, RANKS_A_NODE, earlier)
    warner = Warner()
    totals: list[float] = []
    parts: dict[str, list[float]] = {name: [] for name in STAGES}
    for _ in range(rounds):
        total, notice, stages = one_round(run, warner)
        totals.append(total)
        for name, spent in stages.items():
            parts[name].append(spent)
    sizes = sorted(len(b) for b in run.answers.values())
    return {
        "nodes": nodes,
        "ranks": nodes * RANKS_A_NODE,
        "mode": mode,
        "recorder_ring": earlier + 5,  # the waiters' recorder before the node trims it
        "check_to_notice": stats_ms(totals),
        **{name: stats_ms(values) for name, values in parts.items()},
        "unpickle_median_ms": statistics.median(run.unpickle_s) * 1e3,
        "answer_bytes_median": statistics.median(sizes),
        "answer_bytes_max": sizes[-1],
        "answers_bytes_total": sum(sizes),
        "notice_files": len(notice.files),
        "notice_files_bytes": sum(len(text.encode()) for _, text in notice.files),
        "notice_rows": len(notice.rows),
        "alert_text_bytes": len(notice.text.encode()),
        "sentence": notice.text.splitlines()[0][:160],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, nargs="+", default=[64, 1000])
    parser.add_argument("--modes", nargs="+", default=["python", "native", "all"], help="captures to simulate")
    parser.add_argument(
        "--earlier",
        type=int,
        nargs="+",
        default=[0],
        help="collectives before the captured ones in each recorder (1995 fills the ring of 2,000)",
    )
    parser.add_argument(
        "--at",
        type=int,
        nargs="+",
        default=[4, 2004],
        help="the real ranks' step where rank 2 stops (2004: every recorder's ring of 2,000 full)",
    )
    parser.add_argument("--skip-real", action="store_true", help="only the simulated nodes")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    logging.getLogger("ray_wandb_nodes").setLevel(logging.ERROR)  # the hang's warning, once a round
    result: dict[str, Any] = {"real": [], "simulated": []}
    if not args.skip_real:
        lib = build_gil_lib()
        modes = ("python", "native") if lib else ("python",)
        for mode, at in itertools.product(modes, args.at):
            case = real_case(mode, at, args.rounds, lib)
            result["real"].append(case)
            dumps = case["request_dumps"]
            print(
                f"4 real ranks, {mode:6s} at step {at:4d} (ring {case['recorder_ring']:4d}): request_dumps "
                f"{dumps['median_ms']:7.1f} ms median {dumps['max_ms']:7.1f} max; judge "
                f"{case['judge']['median_ms']:.2f} ms; hang_notice {case['hang_notice']['median_ms']:.2f} ms  "
                f"({case['sentence']})"
            )
    for mode, earlier, nodes in itertools.product(args.modes, args.earlier, args.nodes):
        case = sim_case(nodes, mode, args.rounds, earlier)
        result["simulated"].append(case)
        parts = "  ".join(f"{p} {case[p]['median_ms']:.0f}" for p in STAGES)
        print(
            f"{nodes:5d} nodes ({case['ranks']:5d} ranks), {mode:6s} ring {case['recorder_ring']:4d}: "
            f"check->notice {case['check_to_notice']['median_ms']:7.0f} ms median "
            f"{case['check_to_notice']['max_ms']:7.0f} max [{parts} ms]; answer "
            f"{case['answer_bytes_median'] / 1024:.0f} KiB a node; notice {case['notice_files']} files "
            f"{case['notice_files_bytes'] / 2**20:.1f} MiB, alert {case['alert_text_bytes'] / 1024:.1f} KiB"
        )
    if args.json:
        from bench._harness import write_result

        write_result(args.json, result)
    return result


if __name__ == "__main__":
    main()
