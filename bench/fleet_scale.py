"""The fleet at 10 to 5,000 nodes, by simulation: what its control loop costs the Train controller.

    python -m bench.fleet_scale [--nodes 10 100 1000 5000] [--minutes 3] [--churn 0.05] [--json FILE]
    python -m bench.fleet_scale --prestart [--nodes 10 100 500 1000 5000]

This machine cannot start 1,000 raylets, so the real ``NodeFleet`` (its plan, logger pool,
pings, node health and writer cap, the code a Train run uses) is driven tick by tick with
simulated answers: ``ray.nodes()`` listings of N nodes (8 GPUs and 96 CPUs each, as Ray returns
them, built afresh for every call), and logger actors that answer at once, each status carrying
a busy 8-GPU node's summary (``tests/support/fakes.py``, built from the plugin's own message
types: every GPU's readings and SM clocks, so the GPU rules run on every node as they would).
The run selects every node (``nodes="cluster"``) with the default cap of 256 node writers, so
past 256 nodes the rest are observers. A clock stands in for time: a tick is
the fleet's 3 s poll, a minute 20 ticks.

For each N, two phases after a warm-up minute (the first start of N loggers, reported apart):
steady (nothing changes), and churn (``--churn`` of the nodes fail and as many new ones join
each minute, spread over its ticks). Reported per phase: controller CPU per minute (% of one
core), GCS calls per second (listings, and placement-group/actor creations and removals, which
follow changes), memory of the fleet (traced allocations), and, for churn, the time from a node
joining the listing to its logger being planned.

``--prestart``: the loggers (a Ray actor and a ``wandb-core`` each) started ahead of the
workers' placement when a 2-node job (16 workers of 1 GPU) starts on a cluster of N nodes,
half of them held by other jobs.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from typing import Any

from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.secrets import CapturedEnv
from ray_wandb_nodes._config.values import Mode, NodeSelection
from ray_wandb_nodes._fleet.commands import AddRun, Poll, Prestart
from ray_wandb_nodes._fleet.fleet import POLL_S, NodeFleet
from ray_wandb_nodes._fleet.targets import SharedTarget
from ray_wandb_nodes._fleet.wire import LoggerStatus
from ray_wandb_nodes._health import HealthMonitor, HealthOptions
from ray_wandb_nodes._run.primary import PrimaryWriter
from ray_wandb_nodes._wandb.writers import primary_spec
from tests.support.fakes import Clock, busy_node, logger_status

TICKS_PER_MINUTE = int(60 / POLL_S)


class Ref:
    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class Method:
    def __init__(self, actor: SimActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any) -> Ref:
        return self._actor.call(self._name, args)


class SimActor:
    """A logger that answers at once: its writers, and a status with a node summary."""

    def __init__(self, sim: SimCluster, node_id: str) -> None:
        self._sim, self.node_id = sim, node_id
        self.index = int(node_id, 16)
        self.runs: set[str] = set()
        self.pid = sim.rnd.randint(1000, 1 << 22)
        self._seq = 0

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)

    def call(self, name: str, args: tuple[Any, ...]) -> Ref:
        if not self._sim.alive.get(self.node_id):
            return Ref(error=RuntimeError("the actor's node died"))
        if name == "add_writer":
            self.runs.add(args[0].run_id)
        elif name == "finish":
            self.runs.discard(args[0])
        return Ref(self._status())

    def _status(self) -> LoggerStatus:
        # A busy 8-GPU node (tests/support/fakes.py: the plugin's own types), six samples of 0.5 s
        # since the last ping, and the transaction-log block they filled (SM clocks, ECC counts).
        self._seq += 6
        t = self._sim.clock.now
        summary = busy_node(self._sim.rnd, self.index, t, seq=self._seq, t0=t - 2.5, batches=[(t - 2.5, t, 6)])
        return logger_status(self.node_id, self.pid, self.runs, summaries=dict.fromkeys(self.runs, summary))


class SimCluster:
    """Simulated ``ray.nodes()`` and the logger pool's Ray calls, counted."""

    def __init__(self, n: int, clock: Clock) -> None:
        self.clock = clock
        self.rnd = random.Random(n)
        self.alive: dict[str, bool] = {}
        self.hosts: dict[str, str] = {}
        self.listings = 0
        self.changes = 0  # placement-group and actor creations and removals
        self.created_at: dict[str, float] = {}
        self.busy: set[str] = set()  # nodes whose GPUs and CPUs other jobs hold
        self._next = 0
        for _ in range(n):
            self.join()

    def place_ranks(self, target: SharedTarget, gpus: int = 8) -> None:
        """A training job on every alive node: ``gpus`` ranks a node, a GPU each (GPU health
        judges only the GPUs a run's ranks hold)."""
        up = [n for n, a in self.alive.items() if a]
        target.ranks = {n: tuple(range(gpus * i, gpus * i + gpus)) for i, n in enumerate(up)}
        target.rank_gpus = {r: (str(r % gpus),) for r in range(gpus * len(up))}

    def join(self) -> str:
        node_id = f"{self._next:056x}"
        self._next += 1
        self.alive[node_id] = True
        self.hosts[node_id] = f"gpu-node-{self._next}"
        return node_id

    def fail(self, node_id: str) -> None:
        self.alive[node_id] = False

    def list_nodes(self) -> list[dict[str, Any]]:
        self.listings += 1
        return [
            {
                "NodeID": node_id,
                "Alive": up,
                "NodeManagerHostname": self.hosts[node_id],
                "NodeManagerAddress": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                "Resources": {"CPU": 96.0, "GPU": 8.0, "accelerator_type:H100": 1.0, "memory": 1.6e12},
                "Labels": {"ray.io/node_id": node_id},
            }
            for i, (node_id, up) in enumerate(self.alive.items())
        ]

    def free_resources(self) -> dict[str, dict[str, float]]:
        """Each alive node's free resources (``ray._private.state.available_resources_per_node``)."""
        return {
            node_id: {"CPU": 0.0, "GPU": 0.0} if node_id in self.busy else {"CPU": 96.0, "GPU": 8.0}
            for node_id, up in self.alive.items()
            if up
        }

    # the pool's Ray calls (see _fleet/actors.py)
    def group_prefix(self) -> str:
        return "ray_wandb_nodes:sim:"

    def close(self) -> None:
        pass

    def create(self, node_id: str, group_name: str) -> tuple[Any, Any]:
        self.changes += 2
        self.created_at.setdefault(node_id, self.clock.now)
        return SimActor(self, node_id), group_name

    def kill(self, actor: Any, pg: Any) -> None:
        self.changes += 2

    def answered(self, refs: Any) -> set[Any]:
        return set(refs)

    def result(self, ref: Ref) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value


class Quiet:
    def __init__(self) -> None:
        self.said: list[str] = []

    def warn(self, key: str, message: str) -> None:
        self.said.append(message)


def make_target(clock: Clock) -> SharedTarget:
    options = build_options(project="scale", sampling_interval_s=15.0)
    env = CapturedEnv(base_url="http://127.0.0.1:9", project="scale")
    spec = primary_spec(
        options, env, mode=Mode.ONLINE, run_id="scale-run", label="node-head-0", display_name="scale",
        group=None, config={}, default_dir="/tmp",
    )  # fmt: skip
    target = SharedTarget(
        primary=PrimaryWriter(spec, warner=Quiet()),  # never started: alerts and tables queue up
        selection=NodeSelection.CLUSTER,
        health=HealthMonitor(HealthOptions(), clock=clock),
        max_writers=options.max_node_writers,
    )
    target.ready = True
    return target


def run_minutes(fleet: NodeFleet, sim: SimCluster, minutes: int, churn: float, joined: dict[str, float]) -> float:
    """Drive ``minutes`` of ticks; the controller CPU seconds they took."""
    cpu = 0.0
    per_minute = int(len([a for a in sim.alive.values() if a]) * churn)
    # this many nodes fail (and as many join) on each tick of a minute
    quota = [per_minute // TICKS_PER_MINUTE + (t < per_minute % TICKS_PER_MINUTE) for t in range(TICKS_PER_MINUTE)]
    for _ in range(minutes):
        for tick in range(TICKS_PER_MINUTE):
            for _ in range(quota[tick] if churn else 0):
                up = [n for n, a in sim.alive.items() if a]
                sim.fail(sim.rnd.choice(up))
                joined[sim.join()] = sim.clock.now
            sim.clock.now += POLL_S
            t0 = time.process_time()
            fleet.step(Poll())
            cpu += time.process_time() - t0
    return cpu


def measure(n: int, minutes: int, churn: float) -> dict[str, Any]:
    """The CPU, GCS and latency figures (a run without allocation tracing, which would slow it),
    then the fleet's memory (the same run again, traced)."""
    out = simulate(n, minutes, churn)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    kept = simulate(n, minutes, churn, keep=True)
    gc.collect()
    out["fleet_mb"] = (tracemalloc.get_traced_memory()[0] - base - kept["sim_bytes"]) / 1e6
    tracemalloc.stop()
    return out


def simulate(n: int, minutes: int, churn: float, keep: bool = False) -> dict[str, Any]:
    clock = Clock()
    before = tracemalloc.get_traced_memory()[0] if keep else 0
    sim = SimCluster(n, clock)
    out: dict[str, Any] = {"nodes": n, "sim_bytes": tracemalloc.get_traced_memory()[0] - before if keep else 0}
    warner = Quiet()
    fleet = NodeFleet(init_timeout_s=90.0, warner=warner, list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    sim.place_ranks(target)
    t0 = time.process_time()
    fleet.step(AddRun(target))
    run_minutes(fleet, sim, 1, 0.0, {})  # warm-up: N loggers started, every writer added
    out["start_cpu_s"] = time.process_time() - t0
    for phase, rate in (("steady", 0.0), ("churn", churn)):
        listings, changes, start = sim.listings, sim.changes, clock.now
        joined: dict[str, float] = {}
        cpu = run_minutes(fleet, sim, minutes, rate, joined)
        seconds = clock.now - start
        planned = [sim.created_at[n] - t for n, t in joined.items() if n in sim.created_at]
        out[phase] = {
            "cpu_pct_of_core": 100.0 * cpu / seconds,
            "listings_per_s": (sim.listings - listings) / seconds,
            "changes_per_s": (sim.changes - changes) / seconds,
            "joined": len(joined),
            "planned_within_s": max(planned) if planned else None,
            "not_planned": len(joined) - len(planned),
        }
    out["members"] = sum(1 for h in fleet.worker.pool.handles() if target.run_id in h.runs)
    out["loggers"] = len(fleet.worker.pool.handles())
    out["warnings"] = warner.said[:3]
    if keep:
        out["fleet"] = (fleet, target, sim)  # alive while the caller reads the traced memory
    return out


def prestart(n: int, workers: int, gpus_per_worker: float, busy: float) -> dict[str, Any]:
    """Loggers started ahead of the workers' placement for one job on a cluster of ``n``
    simulated nodes (8 GPUs each), ``busy`` of them held by other jobs: actors created."""
    import inspect

    clock = Clock()
    sim = SimCluster(n, clock)
    sim.busy = set(sim.rnd.sample(sorted(sim.alive), int(n * busy)))
    kwargs: dict[str, Any] = dict(
        init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock
    )
    if "free_resources" in inspect.signature(NodeFleet).parameters:  # (a fleet from before it could count)
        kwargs["free_resources"] = sim.free_resources
    fleet = NodeFleet(**kwargs)
    target = make_target(clock)
    target.selection, target.ready = NodeSelection.WORKERS, False  # a Train run whose W&B run is being created
    fleet.step(AddRun(target))
    per_worker = {"CPU": 1.0, "GPU": gpus_per_worker}
    fleet.step(Prestart(True, None, workers, per_worker))  # what TrainRun asks at the controller's start
    job_nodes = -(-int(workers * gpus_per_worker) // 8)
    return {"nodes": n, "workers": workers, "job_nodes": job_nodes, "loggers": len(fleet.worker.pool.handles())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000, 5000])
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--churn", type=float, default=0.05)
    parser.add_argument("--json")
    parser.add_argument(
        "--prestart", action="store_true", help="only: loggers started ahead for a 2-node job (16 workers x 1 GPU)"
    )
    args = parser.parse_args()
    if args.prestart:
        print("loggers started ahead of a 2-node job (16 workers x 1 GPU, 8-GPU nodes), half the nodes busy")
        print(f"{'nodes':>6} {'job nodes':>9} {'loggers':>8}")
        for n in args.nodes:
            r = prestart(n, 16, 1.0, 0.5)
            print(f"{n:>6} {r['job_nodes']:>9} {r['loggers']:>8}")
        return
    print(f"fleet control loop, simulated ({POLL_S:g} s ticks; churn {args.churn:.0%} of nodes a minute)")
    print(
        f"{'nodes':>6} {'writers':>8} {'start s':>8} | {'steady CPU':>10} {'list/s':>7} | "
        f"{'churn CPU':>9} {'list/s':>7} {'pg+actor/s':>10} {'planned in':>10} | {'memory':>8}"
    )
    results = []
    for n in args.nodes:
        r = measure(n, args.minutes, args.churn)
        s, c = r["steady"], r["churn"]
        planned = "-" if c["planned_within_s"] is None else f"{c['planned_within_s']:.0f} s"
        print(
            f"{n:>6} {r['members']:>8} {r['start_cpu_s']:>8.2f} | "
            f"{s['cpu_pct_of_core']:>9.3f}% {s['listings_per_s']:>7.2f} | "
            f"{c['cpu_pct_of_core']:>8.3f}% {c['listings_per_s']:>7.2f} {c['changes_per_s']:>10.2f} {planned:>10} | "
            f"{r['fleet_mb']:>5.1f} MB"
        )
        results.append(r)
    if args.json:
        from bench._harness import write_result

        write_result(args.json, {"bench": "fleet_scale", "churn": args.churn, "results": results})


if __name__ == "__main__":
    main()
