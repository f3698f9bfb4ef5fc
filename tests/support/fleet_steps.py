"""A fleet's slow-rank path at scale, simulated on one time axis: a synchronous job of ``nodes`` x
``ranks`` ranks stepping together (numpy: every rank's parts a step, with noise), each node's
reads of its ranks every ``node_steps.READ_S`` kept as points (the real ``NodePoints``), the
fleet's real ping turn (``pings.PingTurn``: at most ``PING_BATCH`` pings a tick of ``POLL_S``, each
answered the next tick with the points its node took when asked), the real ``feed_steps`` every
tick into the real ``RankHealth`` (the windows by step and the rank rule).

What is simulated: the ranks (their parts are drawn, not measured; DDP times every iteration
here) and the nodes' processes (no Ray, no actors). What runs for real: everything from a node's
points to the rule's alert. ``python -m bench.slow_ranks_scale`` gives the figures at 1,000 nodes;
``tests/unit/steps/test_fleet_scale.py`` runs a smaller fleet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ray_wandb_nodes._fleet.node_steps import READ_S
from ray_wandb_nodes._fleet.pings import PingTurn
from ray_wandb_nodes._fleet.pool import LoggerHandle
from ray_wandb_nodes._fleet.steps import feed_steps
from ray_wandb_nodes._health import RankAt
from ray_wandb_nodes._health.alerts import Alert
from ray_wandb_nodes._health.ranks import RankHealth
from ray_wandb_nodes._steps import NodePoints, Sources, StepTotals

KEY = "run-1.attempt-1"
POLL_S = 3.0  # the fleet's tick and ping interval (_fleet.fleet.POLL_S)
SOURCES = Sources.INPUT | Sources.OPTIMIZER | Sources.DDP
_NS = 1e9
SLICE_S = 0.1  # the simulation's time step: a node reads in its tenth of each second


@dataclass(frozen=True)
class Job:
    """A job's parts a step, in seconds, and the noise on them (a share, uniform either way)."""

    input_s: float = 0.03
    compute_s: float = 0.2
    optimizer_s: float = 0.02
    other_s: float = 0.01
    comm_s: float = 0.04
    noise: float = 0.15
    slow_rank: int | None = None  # this rank's input takes ``slow_input_s`` more from ``slow_from_s``
    slow_input_s: float = 0.2
    slow_from_s: float = 0.0


@dataclass
class Outcome:
    """What the run was told: each alert with its simulated time, and the judge's CPU."""

    alerts: list[tuple[float, Alert]] = field(default_factory=list)
    judge_cpu_s: float = 0.0  # the fleet thread's part: feed_steps and the rule, every tick
    node_cpu_s: float = 0.0  # the nodes' part, all of them: points kept and taken
    judged: int = 0
    steps: int = 0


class _Actor:
    """What the ping turn asks of a node logger: its status, answered next tick."""

    def __init__(self, node: int, asked: list[int]) -> None:
        self.status = SimpleNamespace(remote=lambda: asked.append(node) or ("ping", node))


class _Answered:
    def __init__(self) -> None:
        self.due: set[Any] = set()

    def answered(self, refs: list[Any]) -> set[Any]:
        return {r for r in refs if r in self.due}


class FleetSim:
    """``nodes`` x ``ranks`` ranks of ``job``; :meth:`run` simulates ``seconds`` of it."""

    def __init__(self, job: Job, nodes: int, ranks: int = 8, seed: int = 0) -> None:
        self.job, self.nodes, self.ranks = job, nodes, ranks
        self.world = nodes * ranks
        self.rng = np.random.default_rng(seed)
        self.totals = np.zeros((self.world, 10), dtype=np.int64)  # StepTotals' fields from steps to comm_ns (_read)
        self.steps = 0
        self.health = RankHealth(window_s=120.0)
        self.points = [NodePoints() for _ in range(nodes)]
        self.phase = self.rng.uniform(0, READ_S, nodes)  # each node reads on its own second
        self.at = {r: RankAt(f"n{r // ranks}", f"node-{r // ranks}") for r in range(self.world)}

    # the job -------------------------------------------------------------------------------------
    def _step(self, now: float) -> float:
        """One step of every rank: its duration."""
        j, n = self.job, self.world
        noise = lambda base: base * (1 + self.rng.uniform(-j.noise, j.noise, n))  # noqa: E731
        inputs, compute, opt, other = noise(j.input_s), noise(j.compute_s), noise(j.optimizer_s), noise(j.other_s)
        if j.slow_rank is not None and now >= j.slow_from_s:
            inputs[j.slow_rank] += j.slow_input_s
        arrive = other + inputs + compute
        done = arrive.max() + j.comm_s
        wait = done - arrive
        step = done + opt.max()
        forward = compute / 3
        self.steps += 1
        t = self.totals
        t[:, 0] = self.steps
        if self.steps > 1:  # the first step's interval is not counted (as the recorder)
            t[:, 1] += 1
            t[:, 2] += int(step * _NS)
            t[:, 4] += 1  # batches
            for column, values in ((3, inputs), (5, opt), (6, forward), (7, compute - forward), (8, wait)):
                t[:, column] += (values * _NS).astype(np.int64)
            t[:, 9] += ((wait + j.comm_s) * _NS).astype(np.int64)
        return float(step)

    def _read(self, rank: int) -> StepTotals:
        s, intervals, step_ns, input_ns, batches, opt_ns, fwd, bwd, wait, comm = self.totals[rank][:10].tolist()
        # DDP times every iteration here (rate 1): its samples are the counted intervals
        return StepTotals(
            SOURCES, s, intervals, step_ns, input_ns, batches, opt_ns, s, intervals, 1, fwd, bwd, wait, comm, 0, 0, 0
        )  # no passes timed (a GPU's DDP): DDP's timers alone

    # the fleet -------------------------------------------------------------------------------------
    def run(self, seconds: float, silent: tuple[int, float] | None = None) -> Outcome:
        """``silent``: (node, from_s): that node's logger answers no ping from then on (gone)."""
        out = Outcome()
        asked: list[int] = []
        answered = _Answered()
        turn = PingTurn(POLL_S)
        handles = {
            f"n{n}": LoggerHandle(
                node=SimpleNamespace(label=f"node-{n}"), actor=_Actor(n, asked), pg=None, runs={"run"}
            )
            for n in range(self.nodes)
        }
        for node_id in handles:
            turn.add(node_id)
        placed = {f"n{n}": tuple(range(n * self.ranks, (n + 1) * self.ranks)) for n in range(self.nodes)}
        target = SimpleNamespace(
            health=SimpleNamespace(rank_steps=lambda steps, at, **_: self.health.read(steps, at, now)),
            attempt=KEY, hangs=None, ranks=placed, ready=True, covered_node=None, steps_fed={},
        )  # fmt: skip
        pool = SimpleNamespace(get=handles.get)
        next_step, next_tick = 0.0, POLL_S
        slices = round(READ_S / SLICE_S)
        by_slice = [[n for n in range(self.nodes) if int(self.phase[n] / SLICE_S) % slices == i] for i in range(slices)]
        pending: list[tuple[int, dict[str, Any]]] = []
        for index in range(round(seconds / SLICE_S)):
            now = (index + 1) * SLICE_S
            while next_step <= now:
                next_step += self._step(next_step)
            if now >= next_tick:
                started = time.process_time()
                if silent is not None and now >= silent[1]:
                    pending = [(node, taken) for node, taken in pending if node != silent[0]]
                for node, taken in pending:  # last tick's pings answered now
                    handles[f"n{node}"].steps = taken
                answered.due = {("ping", node) for node, _ in pending}
                pending = []
                for handle, _ref in turn.answered(answered):
                    handle.ping = None
                out.node_cpu_s += time.process_time() - started
                started = time.process_time()
                feed_steps(target, pool, {})  # type: ignore[arg-type]
                out.alerts += [(now, a) for a in self.health.take_alerts()]
                out.judge_cpu_s += time.process_time() - started
                turn.send(handles, now, lambda _h: set())
                started = time.process_time()
                for node in asked:  # each node answers with the points it took when asked
                    pending.append((node, self.points[node].take({KEY})))
                asked.clear()
                out.node_cpu_s += time.process_time() - started
                next_tick += POLL_S
            started = time.process_time()
            for node in by_slice[index % slices]:  # the nodes whose second of reading this is
                first = node * self.ranks
                for rank in range(first, first + self.ranks):
                    self.points[node].add(KEY, rank, 1000 + rank, self._read(rank))
            out.node_cpu_s += time.process_time() - started
        out.judged, out.steps = self.health.judged, self.steps
        return out
