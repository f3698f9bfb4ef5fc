"""Synchronous data-parallel steps, simulated on one true time axis and seen by each rank on its
own clock (a constant offset a rank), through the rank side as it runs: a :class:`StepRecorder`
fed by the same hooks torch calls (optimizer pre and post, a timed ``next()``) and a DDP whose
logger keeps DDP's running means of the iterations it samples, as ``reducer.cpp`` and
``logger.cpp`` do. What comes out is each rank's region, decoded: what the node reads.

Each step, rank ``r`` does, in order: the rest of its loop (``other``), waits for its batch
(``input``), runs forward and backward compute, then joins the step's all-reduce; the all-reduce
ends ``comm`` after the last rank joins, and each rank then steps its optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray_wandb_nodes._steps import RegionWriter, StepRecorder, StepTotals, decode, sampled_iterations
from ray_wandb_nodes._worker.step_inputs import Current, timed_fetch

MS = 1_000_000  # ns


@dataclass(frozen=True)
class Profile:
    """One rank's parts a step, in ms of true time."""

    input: float = 5.0
    forward: float = 10.0
    backward: float = 20.0
    optimizer: float = 2.0
    other: float = 1.0


class FakeLogger:
    """DDP's logger as ``logger.cpp`` keeps it: at the forward after a sampled iteration, that
    iteration's durations go into running means (integer division, as in C++)."""

    def __init__(self) -> None:
        self.ints: dict[str, int] = {}
        self.recorded = 0

    def record(self, iteration: int, fwd: int, bwd: int, comm: int, overlap: int) -> None:
        self.recorded += 1
        n = self.recorded
        for key, value in (
            ("avg_forward_compute_time", fwd),
            ("avg_backward_compute_time", bwd),
            ("avg_backward_comm_time", comm),
            ("avg_backward_compute_comm_overlap_time", overlap),
        ):
            self.ints[key] = (value + self.ints.get(key, 0) * (n - 1)) // n
        self.ints["iteration"] = iteration

    def _get_ddp_logging_data(self) -> Any:
        return type("Data", (), {"ints_map": dict(self.ints)})()


class FakeDdp:
    """What the recorder reads of a ``DistributedDataParallel``."""

    device_type = "cpu"
    reducer = object()

    def __init__(self) -> None:
        self.logger = FakeLogger()
        self.rate = 100
        self.iteration = 0
        self.pending: tuple[int, int, int, int] | None = None

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self.rate = rate

    def forward_begins(self) -> None:
        """``_pre_forward``: the last iteration's stats if it was sampled, then a new iteration."""
        if self.pending is not None and sampled_iterations(self.iteration, self.rate) > self.logger.recorded:
            self.logger.record(self.iteration, *self.pending)
        self.iteration += 1


class SimRank:
    """One rank: its clock, recorder, timed input and DDP."""

    def __init__(self, rank: int, offset_ns: int, ddp: bool) -> None:
        self.rank = rank
        self.offset = offset_ns
        self.t = 0  # this rank's true time
        self.region = bytearray(256)
        self.recorder = StepRecorder(RegionWriter(self.region), clock=lambda: self.t + self.offset)
        self.recorder.hooks_in_place()
        current = Current()
        current.recorder = self.recorder
        self._fetch = timed_fetch(current, self._wait_input)
        self._input_ns = 0
        self.ddp = FakeDdp() if ddp else None
        if self.ddp is not None:
            self.recorder.attach_ddp(self.ddp)

    def _wait_input(self, _iterator: Any) -> None:
        self.t += self._input_ns

    def fetch(self, input_ns: int) -> None:
        self._input_ns = input_ns
        self._fetch(None)

    def read(self) -> StepTotals | None:
        return decode(bytes(self.region))


class World:
    """Ranks with ``profiles`` stepping together; ``jitter[step][rank]`` ms is added to a rank's
    input on a step. Each rank's recorder publishes after every step."""

    def __init__(
        self,
        profiles: Sequence[Profile],
        offsets_ns: Sequence[int] | None = None,
        comm_ms: float = 3.0,
        ddp: bool = True,
        jitter: Sequence[Sequence[float]] | None = None,
    ) -> None:
        offsets = list(offsets_ns) if offsets_ns is not None else [0] * len(profiles)
        self.profiles = list(profiles)
        self.ranks = [SimRank(r, offsets[r], ddp) for r in range(len(profiles))]
        self.comm_ms = comm_ms
        self.jitter = jitter
        self.step = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self._one()
            self.step += 1

    def reads(self) -> dict[int, StepTotals]:
        out = {}
        for sim in self.ranks:
            totals = sim.read()
            assert totals is not None
            out[sim.rank] = totals
        return out

    def _one(self) -> None:
        arrivals = []
        for r, (sim, p) in enumerate(zip(self.ranks, self.profiles, strict=True)):
            extra = self.jitter[self.step][r] if self.jitter is not None else 0.0
            sim.t += int(p.other * MS)
            sim.fetch(int((p.input + extra) * MS))
            if sim.ddp is not None:
                sim.ddp.forward_begins()
            start = sim.t
            sim.t += int(p.forward * MS)
            bwd_start = sim.t
            sim.t += int(p.backward * MS)
            arrivals.append((start, bwd_start, sim.t))
        done = max(a[2] for a in arrivals) + int(self.comm_ms * MS)
        for r, (sim, p) in enumerate(zip(self.ranks, self.profiles, strict=True)):
            start, bwd_start, end = arrivals[r]
            overlap = int(0.5 * MS)  # the first bucket launches half a ms before compute ends
            if sim.ddp is not None:
                sim.ddp.pending = (bwd_start - start, end - bwd_start, done - (end - overlap), overlap)
            sim.t = done
            sim.recorder.optimizer_pre()
            sim.t += int(p.optimizer * MS)
            sim.recorder.optimizer_post()
        for sim in self.ranks:
            sim.recorder.publish()
