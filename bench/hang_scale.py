"""False hang alerts at scale: a healthy job on 8 to 1,000 simulated nodes with a fixed limit.

    python -m bench.hang_scale [--nodes 8 64 1000] [--minutes 10] [--limit-s 30] [--step-s 5] [--json FILE]
    python -m bench.hang_scale --stuck [--nodes 1000]   # one rank stops mid-run: the alert, its end

A node's ping brings its ranks' progress as its logger read their beacons, and the pool pings at
most ``PING_BATCH`` loggers a tick: at 1,000 nodes each logger is pinged about every 29 s under a
30 s limit (a tick of 1.875 s), so a healthy rank's last reading can be older than the limit. The
real ``NodeFleet`` (pool, pings, node health, the run's ``HangWatch``) is driven tick by tick on a
simulated clock, as in ``bench/fleet_scale.py``; each simulated logger answers its pings with its 8
ranks' progress (``LoggerStatus.progress``, the beacons' counts and ages at the moment the pool
takes the answer) and an evidence round (``hang_evidence``) with their progress then and a stack.
The job is data-parallel: every rank steps together (an all-reduce a step), at intervals drawn
around ``--step-s`` (+-30 %, seeded). At the end every rank returns (Train's poll, the
``RanksFinished`` command) and the run is retired as a run's end retires it.

Reported per N: hang alerts (ERROR) and closing notices (INFO), evidence rounds and the nodes they
asked, pings out of turn (fresher readings of suspected ranks), pings in turn, and the mean
interval between two pings of one logger. With ``--stuck`` one rank stops at half time (the others
wait in the next all-reduce) and resumes ``--stuck-s`` later (0: never; the run's end then closes
the hang): the delay from the job's last progress to the alert, and the notices' titles. Figures are simulated
time: no Ray, no wandb, no processes.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
from collections.abc import Callable
from typing import Any

from bench.fleet_scale import Quiet, SimActor, SimCluster, make_target
from ray_wandb_nodes._fleet.commands import AddRun, Poll, RanksFinished, Retire
from ray_wandb_nodes._fleet.fleet import POLL_S, NodeFleet
from ray_wandb_nodes._fleet.hangs import HangWatch, poll_s
from ray_wandb_nodes._fleet.wire import LoggerStatus
from ray_wandb_nodes._hang import Frame, HangNotice, HangTimeout, Phase, RankEvidence, RankProgress, ThreadStack
from tests.support.fakes import Clock, logger_status

RANKS = 8  # a node
USER = "/home/me/train.py"
TORCH = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
STEPPING = (Frame(TORCH, 2501, "all_reduce"), Frame(USER, 88, "train_step"), Frame(USER, 120, "train_loop"))
STUCK = (Frame(USER, 47, "load_next_shard"), Frame(USER, 110, "train_loop"))


class Job:
    """A data-parallel job's optimizer steps on the simulated clock, every rank together; from
    ``stop_at`` rank ``stuck`` stops and the others wait for it in the next all-reduce, until
    ``release_at`` (None: never)."""

    def __init__(
        self, clock: Clock, step_s: float, seed: int, stuck: int | None, stop_at: float, release_at: float | None
    ) -> None:
        self._clock, self._step_s, self._rnd = clock, step_s, random.Random(seed)
        self.start = clock.now
        self.stuck, self.stop_at, self.release_at = stuck, stop_at, release_at
        self._times: list[float] = []
        self._next = self.start + self._interval()
        self._slowest: float | None = None
        self.last_before_stop: float | None = None  # the job's last step before its stop

    def _interval(self) -> float:
        return self._step_s * self._rnd.uniform(0.7, 1.3)

    def _advance(self, now: float) -> None:
        while self._next <= now:
            if self.stuck is not None and self._next >= self.stop_at:
                if self.last_before_stop is None:
                    self.last_before_stop = self._times[-1] if self._times else self.start
                if self.release_at is None or now < self.release_at:
                    return
                self._next = max(self._next, self.release_at)
                self.stuck = None  # released: steps on
            if self._times:
                gap = self._next - self._times[-1]
                self._slowest = gap if self._slowest is None else max(self._slowest, gap)
            self._times.append(self._next)
            self._next += self._interval()

    def progress(self, rank: int, pid: int) -> RankProgress:
        """``rank``'s beacon as its node reads it now."""
        now = self._clock.now
        self._advance(now)
        last = self._times[-1] if self._times else self.start
        steps = len(self._times)
        return RankProgress(
            rank, pid, steps, steps, bool(steps), now - last, Phase.RUNNING, now - self.start, self._slowest, 12
        )

    def stack(self, rank: int) -> tuple[Frame, ...]:
        return STUCK if rank == self.stuck else STEPPING


class Later:
    """A call's answer, made when the pool takes it (its ages as of then, as a logger's are when it runs the call)."""

    error = None

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make

    @property
    def value(self) -> Any:
        return self._make()


class BeaconNode(SimActor):
    """A logger whose pings carry its ranks' beacons and that answers an evidence round."""

    def __init__(self, sim: HangCluster, node_id: str) -> None:
        super().__init__(sim, node_id)
        self._hang_sim = sim
        self.pings = 0

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == "status" and self._sim.alive.get(self.node_id):
            self.pings += 1
            return Later(self._status)
        return super().call(name, args)

    def _status(self) -> LoggerStatus:
        ranks = self._hang_sim.ranks.get(self.node_id, ())
        progress = {self._hang_sim.attempt: tuple(self._hang_sim.job.progress(r, self.pid + r) for r in ranks)}
        return logger_status(self.node_id, self.pid, self.runs, progress=progress)

    def evidence(self, run_id: str, ranks: list[int]) -> tuple[tuple[RankProgress, RankEvidence], ...]:
        job = self._hang_sim.job
        return tuple(
            (
                job.progress(r, self.pid + r),
                RankEvidence(r, self.pid + r, 7, native=(ThreadStack(7, job.stack(r), "TrainingThread(train_loop)"),)),
            )
            for r in ranks
        )


class HangCluster(SimCluster):
    def __init__(self, n: int, clock: Clock, job: Job) -> None:
        self.job, self.run_id, self.attempt = job, "", ""
        self.ranks: dict[str, tuple[int, ...]] = {}
        super().__init__(n, clock)

    def create(self, node_id: str, group_name: str) -> tuple[Any, Any]:
        self.changes += 2
        return BeaconNode(self, node_id), group_name


def watch_for(setting: HangTimeout, clock: Clock, ask: Callable[..., Any]) -> HangWatch:
    """The run's hang watch, on the simulated clock, asking the simulated loggers for evidence."""
    return HangWatch(setting, clock=clock, ask=ask)


def simulate(
    n: int,
    minutes: float,
    limit_s: float,
    step_s: float,
    *,
    stuck_s: float | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """``minutes`` of a job on ``n`` nodes under a fixed ``limit_s``; ``stuck_s``: one rank stops at
    half time for that long (0: to the end)."""
    clock = Clock()
    start = clock.now
    stop_at = start + minutes * 30
    stuck = (n // 2) * RANKS + 3 if stuck_s is not None else None
    job = Job(clock, step_s, seed, stuck, stop_at, stop_at + stuck_s if stuck_s else None)
    sim = HangCluster(n, clock, job)
    setting = HangTimeout(seconds=limit_s)
    poll = poll_s(setting, POLL_S)
    fleet = NodeFleet(
        init_timeout_s=90.0,
        warner=Quiet(),
        poll_s=poll,
        list_nodes=sim.list_nodes,
        actors=sim,
        clock=clock,  # type: ignore[arg-type]
    )
    target = make_target(clock)
    sim.place_ranks(target, RANKS)
    target.attempt = f"{target.run_id}.a1.simulate"  # the ranks' folder on every node, the key of their progress
    sim.run_id, sim.ranks, sim.attempt = target.run_id, target.ranks, target.attempt
    notices: list[tuple[float, HangNotice]] = []
    target.primary.hang = lambda notice: notices.append((clock.now, notice))  # type: ignore[method-assign]
    asked: list[int] = []

    def ask(actors: list[Any], run_id: str, ranks: list[list[int]]) -> list[Any]:
        asked.append(len(actors))
        return [actor.evidence(run_id, mine) for actor, mine in zip(actors, ranks, strict=True)]

    target.hangs = watch_for(setting, clock, ask)
    fleet.step(AddRun(target))
    for _ in range(int(minutes * 60 / poll)):
        clock.now += poll
        fleet.step(Poll())
    # The end: every rank returned (Train's poll), then the run's end, its primary last.
    fleet.step(RanksFinished(target.run_id, frozenset(r for ranks in target.ranks.values() for r in ranks)))
    done = threading.Event()
    before_primary: list[int] = []
    fleet.step(Retire(target.run_id, 30.0, lambda: before_primary.append(len(notices)), None, done))
    while not done.is_set():
        clock.now += poll
        fleet.step(Poll())
    nodes = [h.actor for h in fleet.worker.pool.handles()]
    refreshed = getattr(target.hangs, "refreshes", None)
    pings = sum(node.pings for node in nodes) - (refreshed.sent if refreshed else 0)
    alerts = [(t, x) for t, x in notices if x.level == "ERROR"]
    return {
        "nodes": n,
        "ranks": n * RANKS,
        "minutes": minutes,
        "limit_s": limit_s,
        "step_s": step_s,
        "hang_alerts": len(alerts),
        "closing_notices": len(notices) - len(alerts),
        "notices_before_primary_finished": before_primary[0] if before_primary else None,
        "titles": [x.title for _, x in notices],
        "evidence_rounds": len(asked),
        "nodes_asked": sum(asked),
        "pings_out_of_turn": refreshed.sent if refreshed else None,
        "pings_in_turn": pings,
        "ping_interval_s": minutes * 60 * n / pings if pings else None,
        "alert_after_progress_s": alerts[0][0] - job.last_before_stop if job.last_before_stop and alerts else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 1000])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--limit-s", type=float, default=30.0)
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--stuck", action="store_true", help="one rank stops at half time")
    parser.add_argument("--stuck-s", type=float, default=120.0, help="for this long (0: to the end)")
    parser.add_argument("--json")
    args = parser.parse_args()
    stuck = args.stuck_s if args.stuck else None
    results = [simulate(n, args.minutes, args.limit_s, args.step_s, stuck_s=stuck) for n in args.nodes]
    print(f"hang_timeout_s={args.limit_s:g}, a step every {args.step_s:g} s (+-30 %), {args.minutes:g} min")
    header = [("nodes", 6), ("alerts", 7), ("closing", 8), ("rounds", 7), ("asked", 7), ("out of turn", 12)]
    print(" ".join(f"{name:>{width}}" for name, width in [*header, ("ping every", 11)]))
    for r in results:
        every = f"{r['ping_interval_s']:.1f} s" if r["ping_interval_s"] else "-"
        out = "-" if r["pings_out_of_turn"] is None else str(r["pings_out_of_turn"])
        print(
            f"{r['nodes']:>6} {r['hang_alerts']:>7} {r['closing_notices']:>8} {r['evidence_rounds']:>7} "
            f"{r['nodes_asked']:>7} {out:>12} {every:>11}"
        )
        if stuck is not None:
            after, titles = r["alert_after_progress_s"], r["titles"]
            print(f"       alert {'-' if after is None else f'{after:.1f} s'} after the last progress: {titles}")
            print(f"       notices in the run before its primary finished: {r['notices_before_primary_finished']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
