"""Windows (pure): a rank's totals at two step counts make its per-step parts over the steps
between them (``marks`` gives every rank's totals at the same two step counts).

Every figure is a difference of one rank's totals divided by that rank's own counts (step
intervals for the parts the rank times every step, DDP's sampled iterations for DDP's parts), so
a window is a set of durations on that rank's clock, and a clock's offset cancels in it. Which
steps a window covers is said by step counts, which every rank of a synchronous job shares.
"""

from __future__ import annotations

from dataclasses import dataclass

from .region import Sources, StepTotals

MIN_INTERVALS = 3  # step intervals a window needs
MAX_DDP_HOLD = 1000  # intervals a window waits for a DDP sample before it is judged without one
_S = 1e-9


@dataclass(frozen=True)
class RankWindow:
    """One rank's step parts over a stretch of steps: means per step, in seconds, on its clock.
    A part that rank does not measure is None (unknown), never zero."""

    rank: int
    first_step: int  # the rank's step count where the window starts
    last_step: int
    intervals: int  # the step intervals counted in it
    step_s: float
    input_s: float | None
    optimizer_s: float | None
    ddp_samples: int  # DDP's timed iterations in it (0: DDP's parts unknown here)
    forward_s: float | None  # DDP's timers: a synced pass's forward, per sample
    backward_s: float | None
    wait_s: float | None  # the time it waited for the others a step: exposed communication and
    # the collectives it blocked in (DDP's buffer sync, FSDP's), where measured
    host_compute_s: float | None = None  # every pass's forward and backward a step, less their waits (CPU)
    passes: float | None = None  # forward passes a step (micro-batches), where timed
    accumulation: float = 1.0  # passes a step, where over one (gradient accumulation): DDP times one

    @property
    def compute_s(self) -> float | None:
        """Forward and backward a step: every pass timed on the host (a CPU model), else DDP's
        timed pass on its device times the passes a step (an estimate where passes accumulate)."""
        if self.host_compute_s is not None:
            return self.host_compute_s
        if self.forward_s is None or self.backward_s is None:
            return None
        return (self.forward_s + self.backward_s) * self.accumulation

    @property
    def other_s(self) -> float:
        """The step less every part measured (never below zero): without DDP's timers this holds
        compute and communication too."""
        known = (self.input_s, self.optimizer_s, self.compute_s, self.wait_s)
        return max(0.0, self.step_s - sum(v for v in known if v is not None))


def rank_window(rank: int, before: StepTotals, after: StepTotals) -> RankWindow | None:
    """``rank``'s window from ``before`` to ``after`` (two reads of its totals); None when no
    step interval was counted between them, or when the totals went back (a new process).

    The wait is DDP's exposed communication per timed iteration (one synced pass a step) plus the
    collectives the rank blocked in inside its passes a step (timed on a CPU model only: DDP's
    buffer sync, FSDP's all-gathers and reduce-scatters). On a CPU model the compute is every
    pass's forward and backward a step less those waits (the backward call holds DDP's exposed
    communication: taken out too); on a GPU it is DDP's timed pass (the synced one) times the
    passes a step (gradient accumulation: the other micro-batches taken to be alike)."""
    intervals = after.intervals - before.intervals
    if after.steps < before.steps or intervals <= 0 or after.step_ns < before.step_ns:
        return None
    sources = after.sources

    def per_step(later: int, earlier: int, source: Sources) -> float | None:
        return max(0, later - earlier) * _S / intervals if source in sources else None

    samples = after.ddp_samples - before.ddp_samples
    ddp = Sources.DDP in sources and samples > 0

    def per_sample(later: int, earlier: int) -> float | None:
        return max(0, later - earlier) * _S / samples if ddp else None

    ddp_wait = per_sample(after.wait_ns, before.wait_ns)
    collectives = per_step(after.collective_ns, before.collective_ns, Sources.COLLECTIVES)
    busy = per_step(after.busy_ns, before.busy_ns, Sources.HOST_COMPUTE)
    waits = [w for w in (ddp_wait, collectives) if w is not None]
    ddp_unknown = Sources.DDP in sources and ddp_wait is None  # DDP's wait not sampled here: unknown
    host_compute = None
    if busy is not None and not ddp_unknown:
        host_compute = max(0.0, busy - (collectives or 0.0) - (ddp_wait or 0.0))
    passes = after.passes - before.passes  # one synced pass a step: the optimizer steps after it
    return RankWindow(
        rank=rank,
        first_step=before.steps,
        last_step=after.steps,
        intervals=intervals,
        step_s=(after.step_ns - before.step_ns) * _S / intervals,
        input_s=per_step(after.input_ns, before.input_ns, Sources.INPUT),
        optimizer_s=per_step(after.optimizer_ns, before.optimizer_ns, Sources.OPTIMIZER),
        ddp_samples=max(0, samples),
        forward_s=per_sample(after.forward_ns, before.forward_ns),
        backward_s=per_sample(after.backward_ns, before.backward_ns),
        wait_s=sum(waits) if waits and not ddp_unknown else None,
        host_compute_s=host_compute,
        passes=passes / intervals if passes > 0 else None,
        accumulation=passes / intervals if passes > intervals else 1.0,
    )
