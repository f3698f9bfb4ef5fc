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
    forward_s: float | None
    backward_s: float | None
    wait_s: float | None  # exposed communication: the time it waited for the others

    @property
    def compute_s(self) -> float | None:
        if self.forward_s is None or self.backward_s is None:
            return None
        return self.forward_s + self.backward_s

    @property
    def other_s(self) -> float:
        """The step less every part measured (never below zero): without DDP's timers this holds
        compute and communication too."""
        known = (self.input_s, self.optimizer_s, self.compute_s, self.wait_s)
        return max(0.0, self.step_s - sum(v for v in known if v is not None))


def rank_window(rank: int, before: StepTotals, after: StepTotals) -> RankWindow | None:
    """``rank``'s window from ``before`` to ``after`` (two reads of its totals); None when no
    step interval was counted between them, or when the totals went back (a new process)."""
    intervals = after.intervals - before.intervals
    if after.steps < before.steps or intervals <= 0 or after.step_ns < before.step_ns:
        return None
    sources = after.sources

    def per_step(later: int, earlier: int, source: Sources) -> float | None:
        return (later - earlier) * _S / intervals if source in sources else None

    samples = after.ddp_samples - before.ddp_samples
    ddp = Sources.DDP in sources and samples > 0

    def per_sample(later: int, earlier: int) -> float | None:
        return max(0, later - earlier) * _S / samples if ddp else None

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
        wait_s=per_sample(after.wait_ns, before.wait_ns),
    )
