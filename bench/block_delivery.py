"""Every transaction-log block reaches the GPU rules, at any fleet size, and how late.

    python -m bench.block_delivery [--nodes 8 64 1000] [--minutes 4] [--sampling-s 2] [--json FILE]

The SM clock and ECC counts reach the GPU rules only in whole blocks of a writer's transaction
log (``_health/summary.py``), and a block reaches the driver side only with a ping of its node's
logger: at most ``PING_BATCH`` loggers a 3 s tick, so at 1,000 nodes a logger is pinged about
every 47 s. The real ``NodeFleet`` (pool, pings, feeding, ``HealthMonitor``) is driven tick by
tick as in ``bench/fleet_scale.py``; each simulated node has the real ``SummaryReader`` of a
logger, fed with stats records (the real protobuf ``Record``\\ s) for one block every
``BLOCK_SAMPLES`` sampling intervals (7 at 8 GPUs: wandb writes a 32 KiB block), and
its status takes the reader's summary as ``NodeLogger.status`` does. GPU 1 of one node gets
an uncorrectable ECC error in the middle of the run.

Reported per N: blocks written, blocks the GPU rules received (each once), the delay from a
block's last sample to the rules (mean, max), the ping interval, and the delay from the ECC
error's block to the memory-error verdict. A block's own delay (up to ``BLOCK_SAMPLES``
sampling intervals: about 105 s at the default 15 s) comes on top of it and is not in these
figures; see docs/gpu-health.md.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from bench.fleet_scale import Quiet, SimActor, SimCluster, make_target
from ray_wandb_nodes._fleet.commands import AddRun, Poll
from ray_wandb_nodes._fleet.fleet import POLL_S, NodeFleet
from ray_wandb_nodes._fleet.wire import LoggerStatus
from ray_wandb_nodes._health import GpuHealth, NodeSummary, SummaryReader
from ray_wandb_nodes._health.kinds import EventKind
from tests.support.fakes import Clock, logger_status

GPUS = 8
BLOCK_SAMPLES = 7  # 8 GPUs' series fill a 32 KiB block in 7 to 8 samples (docs/gpu-health.md)


class _Tail:
    """A transaction log's tail: the records of the blocks written since the last read."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.partial: list[Any] = []  # the records of the block being written: read once the writer ended
        self.error = None
        self.ended = False

    def read(self, to_end: bool = False) -> list[Any]:
        out, self.records = self.records, []
        if to_end:
            out, self.partial, self.ended = out + self.partial, [], True
        return out


class _Run:
    """A writer as the reader sees it: its kept samples and its transaction log's path."""

    def __init__(self) -> None:
        self._system_metrics: dict[str, list[tuple[float, float]]] = {}
        self.settings = type("Settings", (), {"sync_file": "run.wandb"})()


def stats_record(t: float, values: dict[str, float]) -> Any:
    """One stats record as wandb-core writes it to the transaction log."""
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    record.stats.timestamp.seconds, record.stats.timestamp.nanos = int(t), int((t % 1) * 1e9)
    for key, value in values.items():
        record.stats.item.add(key=key, value_json=json.dumps(value))
    return record


class BlockNode(SimActor):
    """A simulated logger whose summaries come from the real reader of a writer that writes a
    block every ``BLOCK_SAMPLES`` samples; ``ecc_at``: when its GPU 1 gets an uncorrectable error."""

    def __init__(self, sim: SimCluster, node_id: str) -> None:
        super().__init__(sim, node_id)
        self.sampling_s: float = getattr(sim, "sampling_s", 2.0)
        self.gpus: int = getattr(sim, "gpus", GPUS)
        self.tail, self.run = _Tail(), _Run()
        self.reader = SummaryReader(tail=lambda path: self.tail)
        self.sampled = sim.clock.now
        self.samples: list[float] = []
        self.written: list[float] = []  # each block's last sample time
        self.ecc_at: float | None = None

    def sample(self) -> None:
        """What the logger's sampler thread does every interval: read the writer's new samples
        (and the block they completed, if any)."""
        for t in self._samples_until(self._sim.clock.now):
            ecc = 1.0 if self.ecc_at is not None and t >= self.ecc_at else 0.0
            self.samples.append(t)
            self.run._system_metrics = {"cpu": [(t, 40.0)], **{f"gpu.{i}.gpu": [(t, 97.0)] for i in range(self.gpus)}}
            if len(self.samples) == BLOCK_SAMPLES:
                clocks = {f"gpu.{i}.smClock": 1980.0 for i in range(self.gpus)}
                errors = {f"gpu.{i}.uncorrectedMemoryErrors": ecc if i == 1 else 0.0 for i in range(self.gpus)}
                self.tail.records += [stats_record(s, {**clocks, **errors}) for s in self.samples]
                self.written.append(t)
                self.samples = []
            self.reader.read(self.run)

    def _status(self) -> LoggerStatus:
        summary = self.reader.take()
        return logger_status(
            self.node_id, self.pid, self.runs, summaries=dict.fromkeys(self.runs, summary) if summary else {}
        )

    def _samples_until(self, now: float) -> Iterator[float]:
        while self.sampled + self.sampling_s <= now:
            self.sampled += self.sampling_s
            yield self.sampled


class BlockCluster(SimCluster):
    def __init__(self, n: int, clock: Clock, sampling_s: float, gpus: int) -> None:
        self.sampling_s, self.gpus = sampling_s, gpus
        super().__init__(n, clock)

    def create(self, node_id: str, group_name: str) -> tuple[Any, Any]:
        self.changes += 2
        self.created_at.setdefault(node_id, self.clock.now)
        return BlockNode(self, node_id), group_name


def simulate(n: int, minutes: float, sampling_s: float, gpus: int = GPUS) -> dict[str, Any]:
    """``minutes`` of a run on ``n`` nodes of ``gpus`` GPUs each, sampled every ``sampling_s``."""
    clock = Clock()
    sim = BlockCluster(n, clock, sampling_s, gpus)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    target = make_target(clock)
    sim.place_ranks(target, gpus)
    fleet.step(AddRun(target))
    gpus: GpuHealth = target.health.gpus
    received: dict[str, list[float]] = {}
    newest: dict[str, float] = {}  # each node's newest sample the rules have had
    verdict: dict[str, float] = {}
    update, judge = gpus.update, gpus.judge

    def counted_update(node_id: str, summary: NodeSummary, arrived: float | None = None) -> None:
        seen = received.setdefault(node_id, [])
        newest[node_id] = max(newest.get(node_id, 0.0), summary.t)
        for batch in summary.gpu_ints:
            if not seen or batch.t > seen[-1][0]:  # the rules take each block once (newer only)
                seen.append((batch.t, clock.now))  # type: ignore[arg-type]
        update(node_id, summary, arrived)

    def timed_judge(live: set[str]) -> Any:
        events = judge(live)
        for event in events:
            if event.kind is EventKind.GPU_MEMORY_ERRORS and not event.recovered:
                verdict.setdefault(event.gpu.node_id, clock.now)
        return events

    gpus.update, gpus.judge = counted_update, timed_judge  # type: ignore[method-assign]
    ticks = int(minutes * 60 / POLL_S)
    bad: BlockNode | None = None
    for tick in range(ticks):
        clock.now += POLL_S
        for handle in fleet.worker.pool.handles():  # every node samples on, pinged or not
            handle.actor.sample()
        if tick == ticks // 2:
            bad = next(iter(fleet.worker.pool.handles())).actor
            bad.ecc_at = clock.now
        fleet.step(Poll())
    nodes = [h.actor for h in fleet.worker.pool.handles()]
    delays, lost = [], 0
    for node in nodes:
        arrived = dict(received.get(node.node_id, []))  # type: ignore[arg-type]
        for t in node.written:
            if t in arrived:
                delays.append(arrived[t] - t)
            elif t <= newest.get(node.node_id, 0.0):  # older than what the rules have from it: lost
                lost += 1
    written = sum(len(node.written) for node in nodes)
    ecc_block = next((t for t in bad.written if t >= bad.ecc_at), None) if bad and bad.ecc_at else None
    said = verdict.get(bad.node_id) if bad else None
    return {
        "nodes": n,
        "blocks_written": written,
        "blocks_received": sum(len(v) for v in received.values()),
        "blocks_lost": lost,
        "dropped_on_nodes": sum(node.reader.dropped for node in nodes),
        "delay_mean_s": sum(delays) / len(delays) if delays else None,
        "delay_max_s": max(delays) if delays else None,
        "ecc_error_at_s": bad.ecc_at if bad else None,
        "ecc_block_written_s": ecc_block,
        "ecc_verdict_after_block_s": said - ecc_block if said is not None and ecc_block is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64, 1000])
    parser.add_argument("--minutes", type=float, default=4)
    parser.add_argument("--sampling-s", type=float, default=2.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    results = [simulate(n, args.minutes, args.sampling_s) for n in args.nodes]
    print(f"sampling every {args.sampling_s:g} s, a block every {BLOCK_SAMPLES} samples, {args.minutes:g} min")
    print(f"{'nodes':>6} {'written':>8} {'received':>9} {'lost':>5} {'delay mean/max s':>17} {'ECC verdict s':>14}")
    for r in results:
        delay = f"{r['delay_mean_s']:.1f} / {r['delay_max_s']:.1f}" if r["delay_mean_s"] is not None else "-"
        ecc = r["ecc_verdict_after_block_s"]
        print(
            f"{r['nodes']:>6} {r['blocks_written']:>8} {r['blocks_received']:>9} {r['blocks_lost']:>5} "
            f"{delay:>17} {'-' if ecc is None else f'{ecc:.0f}':>14}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
