"""Windows (pure): two reads of a rank's totals make its per-step parts over the steps between
them, and the ranks' windows are compared only when they cover the same steps.

Every figure is a difference of one rank's totals divided by that rank's own counts (step
intervals for the parts the rank times every step, DDP's sampled iterations for DDP's parts), so
a window is a set of durations on that rank's clock, and a clock's offset cancels in it. Which
steps a window covers is said by step counts, which every rank of a synchronous job shares: the
ranks' windows are compared only when their first and last step counts agree (within
:func:`tolerance`), never by when they were read.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from .recorder import PUBLISH_EVERY
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


def tolerance(span: int) -> int:
    """How far apart (in steps) two ranks' window ends may be and still count as the same steps:
    ranks publish on every 32nd step (``recorder``), so one read can find them that far apart;
    over a long window, a tenth of it (the means per step of a steady job do not move with it)."""
    return max(PUBLISH_EVERY, span // 10)


def aligned(windows: list[RankWindow]) -> bool:
    """Whether ``windows`` cover the same steps, by their step counts."""
    if not windows:
        return False
    span = int(statistics.median(w.last_step - w.first_step for w in windows))
    firsts = [w.first_step for w in windows]
    lasts = [w.last_step for w in windows]
    return max(firsts) - min(firsts) <= tolerance(span) and max(lasts) - min(lasts) <= tolerance(span)


class StepWindows:
    """The reads of every rank of one job, made into windows: each call to :meth:`advance` with
    the latest totals of every rank gives the windows since the last windows given, once every
    rank has :data:`MIN_INTERVALS` step intervals in its window (and, where the ranks run DDP,
    one of DDP's samples, for up to :data:`MAX_DDP_HOLD` intervals). With ``world`` given, only a
    read of all its ranks makes windows: ranks are judged against each other, and the rank that is
    not read may be the one the others wait for. One owner: the thread that judges the ranks."""

    def __init__(
        self, world: int | None = None, min_intervals: int = MIN_INTERVALS, max_ddp_hold: int = MAX_DDP_HOLD
    ) -> None:
        self.world = world
        self.min_intervals = min_intervals
        self.max_ddp_hold = max_ddp_hold
        self._base: dict[int, StepTotals] = {}

    def advance(self, reads: Mapping[int, StepTotals]) -> list[RankWindow] | None:
        """The windows of every rank read, by rank; None while they are not ready (too short,
        a rank restarted, or the ranks' windows cover different steps: then they start again)."""
        if self.world is not None and not set(range(self.world)) <= set(reads):
            return None
        fresh = [r for r, t in reads.items() if r not in self._base or t.steps < self._base[r].steps]
        for rank in fresh:
            self._base[rank] = reads[rank]  # a new rank, or a new process for it: counted from here
        if fresh:
            return None
        windows = [rank_window(r, self._base[r], reads[r]) for r in sorted(reads)]
        if any(w is None or w.intervals < self.min_intervals for w in windows):
            return None  # a rank without steps since: wait (the hang rules speak of stopped ranks)
        ready = [w for w in windows if w is not None]
        if not aligned(ready):
            self._rebase(reads)
            return None
        ddp = all(Sources.DDP in reads[w.rank].sources for w in ready)
        if ddp and any(w.ddp_samples == 0 for w in ready) and min(w.intervals for w in ready) < self.max_ddp_hold:
            return None
        self._rebase(reads)
        return ready

    def forget(self, rank: int) -> None:
        self._base.pop(rank, None)

    def _rebase(self, reads: Mapping[int, StepTotals]) -> None:
        self._base.update(reads)
