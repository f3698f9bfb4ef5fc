"""Fake node summaries and logger statuses, built from the plugin's own message types (so they
cannot drift from what a node's reader and logger send): the unit tests and the benchmarks
(``bench/health_cost.py``, ``bench/fleet_scale.py``) feed the monitor and the fleet with these.

``busy_node`` is a node as a healthy 8-GPU job's writer reports it: every key the node and GPU
rules read (CPU, memory, each GPU's utilisation, memory, temperature, power and its limit, the
SM clock and ECC counts of its transaction-log blocks, the GPUs' models and UUIDs).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ray_wandb_nodes._fleet.wire import LoggerStatus
from ray_wandb_nodes._gpu_ids import RankGpus
from ray_wandb_nodes._hang import RankProgress
from ray_wandb_nodes._health import (
    GpuIntBatch,
    GpuInts,
    GpuInventory,
    GpuSummary,
    HealthMonitor,
    HealthOptions,
    NodeSummary,
    ReadProblem,
)

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def gpu(util: float | None, **values: float | None) -> GpuSummary:
    """One GPU's readings: ``util`` and, unless given, a busy H100's memory, heat and power."""
    base: dict[str, float | None] = {"mem": 50.0, "temp": 60.0, "power": 500.0, "limit": 700.0}
    return GpuSummary(util=util, **{**base, **values})


def gpus(utils: Sequence[float], **values: float | None) -> dict[int, GpuSummary]:
    """GPUs 0.. at these utilisations."""
    return {i: gpu(u, **values) for i, u in enumerate(utils)}


def ints(sm: float | None, util: float | None = 100.0, **counts: float | None) -> GpuInts:
    """One GPU's readings of a log block whose samples were all at ``util`` % (busy at 50 % or
    more, as the reader judges each sample) and ``sm`` MHz; ``counts``: ``ecc_c=``, ``ecc_u=``."""
    busy = util is not None and sm is not None and util >= 50.0
    return GpuInts(
        sm=sm, busy_sm=sm if busy else None, busy_util=util if busy else None, **{"ecc_c": 0.0, "ecc_u": 0.0, **counts}
    )


def clocks(n: int, sm: float = 1980.0, util: float | None = 100.0, **slow: float) -> dict[int, GpuInts]:
    """``n`` GPUs' integer readings of a busy block at ``sm`` MHz and no ECC error; ``g3=900.0``:
    GPU 3's clock."""
    out = {i: ints(sm, util) for i in range(n)}
    for index, value in slow.items():
        out[int(index[1:])] = ints(value, util)
    return out


def inventory(count: int, node: str, model: str = H100) -> GpuInventory:
    return GpuInventory(models=(model,) * count, uuids=tuple(f"GPU-{node}-{i}" for i in range(count)))


def summary(
    t: float,
    *,
    t0: float | None = None,
    n: int = 1,
    seq: int | None = None,
    gpus: Mapping[int, GpuSummary] | None = None,
    ints: Mapping[int, GpuInts] | None = None,
    ints_span: tuple[float, float, int] | None = None,
    batches: Iterable[GpuIntBatch] = (),
    info: GpuInventory | None = None,
    **scalars: float | None,
) -> NodeSummary:
    """A node summary at time ``t``; ``ints``: one transaction-log batch at ``ints_span``
    ((t0, t, samples), default this sample's), or ``batches``; ``scalars``: ``cpu=``, ``mem=``, ..."""
    batch = list(batches)
    if ints is not None:
        start, end, samples = ints_span or (t if t0 is None else t0, t, 1)
        batch.append(GpuIntBatch(start, end, samples, dict(ints)))
    return NodeSummary(
        t0=t if t0 is None else t0,
        t=t,
        n=n,
        seq=seq,
        gpus=dict(gpus or {}),
        gpu_ints=tuple(batch),
        gpu_info=info,
        **scalars,  # type: ignore[arg-type]
    )


def busy_node(
    rnd: random.Random,
    node: int,
    t: float,
    *,
    seq: int,
    gpu_count: int = 8,
    t0: float | None = None,
    batches: Iterable[tuple[float, float, int]] = (),
) -> NodeSummary:
    """A busy GPU node's summary (a little noise from ``rnd``): ``batches``, the (t0, t, samples)
    of the transaction-log blocks its reader read lately (each with every GPU's SM clock)."""
    return summary(
        t,
        t0=t0,
        seq=seq,
        cpu=rnd.uniform(5, 90),
        mem=rnd.uniform(20, 60),
        rss_mb=rnd.uniform(500, 9000),
        net_sent=1e9 + seq * 1e6,
        net_recv=2e9 + seq * 1e6,
        gpus={
            i: GpuSummary(rnd.uniform(90, 100), rnd.uniform(30, 90), rnd.uniform(50, 80), rnd.uniform(400, 700), 700.0)
            for i in range(gpu_count)
        },
        batches=[
            GpuIntBatch(b0, b1, k, {i: ints(rnd.uniform(1900, 1980)) for i in range(gpu_count)})
            for b0, b1, k in batches
        ],
        info=GpuInventory((H100,) * gpu_count, tuple(f"GPU-{node:08x}-{i}" for i in range(gpu_count))),
    )


def logger_status(
    node_id: str,
    pid: int,
    runs: Iterable[str] = (),
    *,
    summaries: Mapping[str, NodeSummary] | None = None,
    errors: Mapping[str, str] | None = None,
    problems: Mapping[str, tuple[ReadProblem, ...]] | None = None,
    hostname: str = "",
    restarted: bool = False,
    final: Mapping[str, NodeSummary] | None = None,
    progress: Mapping[str, tuple[RankProgress, ...]] | None = None,
) -> LoggerStatus:
    """A ``NodeLogger.status()`` answer (``final``: a finish's, with its writers' last summaries;
    ``progress``: its train ranks' beacons, by run id)."""
    run_ids = tuple(sorted(runs))
    return LoggerStatus(
        pid=pid,
        node_id=node_id,
        hostname=hostname,
        restarted=restarted,
        runs=run_ids,
        labels={r: f"node-{hostname or node_id[:6]}" for r in run_ids},
        errors=dict(errors or {}),
        summaries=dict(summaries or {}),
        problems=dict(problems or {}),
        final=dict(final or {}),
        progress=dict(progress or {}),
    )


class Clock:
    """The time in seconds that a test moves (``now``), for the monitor and the fleet."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Job:
    """A monitor of a job on GPU nodes: node id -> (GPU count, ranks, model); ranks use GPUs in order
    (``rank_gpus`` instead: each rank's Ray GPU ids). Its ranks have reported once, unless not ``reported``."""

    def __init__(
        self,
        nodes: dict[str, tuple[int, tuple[int, ...], str]],
        reported: bool = True,
        rank_gpus: dict[int, RankGpus] | None = None,
        **options: Any,
    ) -> None:
        self.clock = Clock()
        self.m = HealthMonitor(HealthOptions(window_s=2, table_every_s=1e9, **options), clock=self.clock)
        self.nodes = nodes
        names = {n: (f"node-{n}-abcdef", n) for n in nodes}
        if rank_gpus is None:
            rank_gpus = {r: (str(i),) for _, ranks, _ in nodes.values() for i, r in enumerate(ranks)}
        self.m.set_nodes(names, {n: ranks for n, (_, ranks, _) in nodes.items()}, (), rank_gpus)
        if reported:
            self.m.report([])
        self.seq = 0
        self.infos: dict[str, GpuInventory] = {}  # a node's inventory other than ``inventory()``'s

    def sample(self, utils: dict[str, Any], ints: dict[str, dict[int, GpuInts]] | None = None) -> Any:
        """One sampling interval of every node (``utils``: node -> its GPUs' utilisations, or
        its GPUs' readings by index); ``ints``: integer series of this interval."""
        self.clock.now += 1
        self.seq += 1
        t = self.clock.now
        for node, (count, _, model) in self.nodes.items():
            self.m.summary(
                node,
                summary(
                    t,
                    seq=self.seq,
                    cpu=10.0,
                    gpus=(gpus(utils[node]) if isinstance(utils[node], list) else utils[node]) if node in utils else {},
                    info=self.infos.get(node) or inventory(count, node, model),
                    ints=(ints or {}).get(node),
                ),
            )
        return self.m.tick()


def job_names(job: Job) -> dict[str, tuple[str, str]]:
    return {n: (f"node-{n}-abcdef", n) for n in job.nodes}
