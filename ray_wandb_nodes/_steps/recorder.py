"""The rank's side: one recorder a process, fed by hooks on the training thread, that keeps the
running totals of its steps and publishes them into its region.

What a step costs the rank (``bench/step_anatomy_cost.py``): the two optimizer hooks read the
clock once each and add a few integers; a timed ``next()`` reads it twice. Nothing wakes a thread
and nothing makes a system call (the clock is the vDSO's). The region is written on every
:data:`PUBLISH_EVERY`-th step, and DDP's timers (a C++ copy of a few microseconds) read on every
:data:`READ_EVERY`-th; a slow step (:data:`SLOW_STEP_NS` or more, where those costs are nothing)
publishes and reads every time. Both are keyed to the step count, which every rank of a
synchronous job shares, so that the ranks' regions hold totals over the same steps.

A hook that fails turns the recorder off (one warning) and never raises into the optimizer or
the data loader: training goes on without its anatomy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .._warn import Warner, describe
from .ddp import DdpSums, DdpTimers
from .region import RegionWriter, Sources, StepTotals

PUBLISH_EVERY = 32  # steps
READ_EVERY = 128  # steps: a multiple of PUBLISH_EVERY (DDP is read when publishing)
SLOW_STEP_NS = 50_000_000
_NO_DDP = DdpSums(0, 0, 0, 0, 0, 0, 0)
_INPUT, _DDP, _DDP_DEVICE = int(Sources.INPUT), int(Sources.DDP), int(Sources.DDP_DEVICE)
_HOST = int(Sources.HOST_COMPUTE | Sources.COLLECTIVES)
_ZERO = (0, 0, 0, 0, 0, 0)
_warner = Warner()


class StepRecorder:
    """A rank's running step totals. The hooks below are its only writers, all on the training
    thread: the optimizer's pre- and post-step hooks (:meth:`optimizer_pre`,
    :meth:`optimizer_post`; the thread that ends the first step, and any that follows an interval
    left out, is ``thread``), the timed iterators (``inputs``, which add to ``input_ns`` and
    ``batches`` around a fetch on ``thread`` and keep ``inside`` against nested timing), the
    timed passes (``_worker.step_loops``: :meth:`open_pass`, ``collective_ns`` with ``waiting``
    against nested timing; a fetch closes the span with :meth:`close_pass`), DDP's construction (:meth:`attach_ddp`) and
    a model's device (:meth:`attach_loop`).

    The parts are added as they happen; a step that ends an interval that does not count (the
    first, one left out) takes them back to where the last counted step left them."""

    __slots__ = (
        "_count",
        "_ddp",
        "_ddp_base",
        "_ddp_sums",
        "_depth",
        "_host",
        "_intervals",
        "_last",
        "_marks",
        "_now",
        "_opt_ns",
        "_pre_at",
        "_sources",
        "_step_ns",
        "_writer",
        "batches",
        "busy_ns",
        "collective_ns",
        "failed",
        "input_ns",
        "inside",
        "now",
        "open",
        "passes",
        "steps",
        "thread",
        "waiting",
    )

    def __init__(self, writer: RegionWriter | None, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._writer = writer
        self._now = self.now = clock  # the input hooks read ``now``
        self._sources = 0  # Sources, as a plain int (flag arithmetic on the enum is slow)
        self.steps = self._intervals = self._step_ns = 0
        self.input_ns = self.batches = self._opt_ns = 0  # running totals, the interval under way included
        self.busy_ns = self.collective_ns = self.passes = 0
        self._marks = _ZERO  # (input_ns, batches, _opt_ns, passes, busy_ns, collective_ns) at the last
        # counted step's end
        self.open = -1  # when the busy span under way began (-1: none): a pass to the next fetch or step
        self.waiting = False  # a timed collective under way
        self._host: bool | None = None  # the models are on the CPU (None: no DDP or FSDP model seen)
        self.inside = False  # a timed fetch is under way (an iterator over another)
        self._depth = 0  # optimizer steps under way (an optimizer that steps another)
        self._pre_at = self._last = -1  # -1: none yet (a clock may read 0)
        self._count = True  # whether the interval under way counts
        self.thread = 0  # the training thread: the one that ends steps (0: none yet)
        self._ddp: DdpTimers | None = None
        self._ddp_sums = self._ddp_base = _NO_DDP  # the totals: a DDP made again adds to the last's
        self.failed = ""

    # the optimizer's hooks (torch's global step hooks) ----------------------------------------------
    def optimizer_pre(self, *_args: Any) -> None:
        """Before an optimizer step (the signature takes the hook's arguments and ignores them)."""
        self._depth += 1
        if self._depth == 1:
            now = self._pre_at = self._now()
            if self.open >= 0:
                self.busy_ns += now - self.open
                self.open = -1

    def optimizer_post(self, *_args: Any) -> None:
        """After an optimizer step: the step ends here, and the interval since the last one."""
        if self._depth > 1:
            self._depth -= 1
            return  # an inner optimizer's step inside an outer one's: one step
        self._depth = 0
        now = self._now()
        try:
            if self._pre_at >= 0:
                self._opt_ns += now - self._pre_at
                self._pre_at = -1
            last = self._last
            self._last = now
            steps = self.steps = self.steps + 1
            if last >= 0 and self._count:
                self._intervals += 1
                self._step_ns += now - last
                self._marks = (
                    self.input_ns, self.batches, self._opt_ns, self.passes, self.busy_ns, self.collective_ns
                )  # fmt: skip
            else:  # the first interval, or one left out: its parts are not counted
                self.input_ns, self.batches, self._opt_ns, self.passes, self.busy_ns, self.collective_ns = self._marks
                self._count = True
                self.thread = threading.get_ident()
            slow = last >= 0 and now - last >= SLOW_STEP_NS
            if slow or not steps % PUBLISH_EVERY:
                self._publish(read=slow or not steps % READ_EVERY)
        except Exception as e:  # noqa: BLE001 - the anatomy off, training on
            self.fail(e)

    @property
    def stepping(self) -> bool:
        """An optimizer's step is under way (between its pre- and post-hook)."""
        return self._depth > 0

    # the passes (``_worker.step_loops``) -----------------------------------------------------------
    def open_pass(self) -> None:
        """A forward pass starts: a busy span opens (one already open goes on)."""
        self.passes += 1
        if self.open < 0:
            self.open = self._now()

    def close_pass(self, now: int) -> None:
        """The busy span under way ends at ``now`` (a fetch's start)."""
        self.busy_ns += now - self.open
        self.open = -1

    # rarer calls ------------------------------------------------------------------------------------
    def attach_ddp(self, ddp: Any) -> None:
        """A DDP was made in this process: read its timers from now on (the latest DDP made is
        the one read; a job that steps two has the latest's parts)."""
        try:
            timers = DdpTimers.attach(ddp)
        except Exception as e:  # noqa: BLE001 - its timers unread, training on
            _warner.warn(f"steps:ddp:{type(e).__name__}", f"DDP's timers are not read on this rank ({describe(e)})")
            return
        if timers is not None:
            self._ddp = timers
            self._ddp_base = self._ddp_sums  # its iterations count on from the last DDP's

    def attach_loop(self, device_type: str) -> None:
        """A DDP or FSDP model on ``device_type`` trains here: its passes are timed on the host,
        which is its compute only while every such model is on the CPU."""
        host = device_type == "cpu"
        self._host = host if self._host is None else self._host and host

    def hooks_in_place(self) -> None:
        """The optimizer's hooks are installed: its parts are measured (zero is then a figure)."""
        self._sources |= int(Sources.OPTIMIZER)

    def leave_out_interval(self) -> None:
        """The interval under way is not a training step (an evaluation, a checkpoint's save):
        its parts are not counted; the step count still is."""
        self._count = False

    def publish(self) -> StepTotals:
        """Write the totals now (the end of training, a test) and return them."""
        try:
            self._publish(read=True)
        except Exception as e:  # noqa: BLE001
            self.fail(e)
        return self.totals()

    def close(self) -> None:
        """Let go of the region (after a last :meth:`publish`); the totals stay readable here."""
        writer, self._writer, self._ddp = self._writer, None, None
        if writer is not None:
            writer.release()

    def fail(self, error: BaseException) -> None:
        """Turn the recorder off for good; said once a process."""
        self.failed = describe(error)
        self._writer = None
        self._ddp = None
        _warner.warn(
            f"steps:{type(error).__name__}", f"this rank's step anatomy is off; training goes on ({self.failed})"
        )

    def totals(self) -> StepTotals:
        """The totals of the counted intervals (the one under way is not in them)."""
        s, (input_ns, batches, opt_ns, passes, busy_ns, collective_ns) = self._ddp_sums, self._marks
        return StepTotals(
            Sources(self._measured()), self.steps, self._intervals, self._step_ns, input_ns, batches, opt_ns,
            s.iteration, s.samples, s.rate, s.forward_ns, s.backward_ns, s.wait_ns, s.comm_ns,
            passes, busy_ns, collective_ns,
        )  # fmt: skip

    def _measured(self) -> int:
        sources = self._sources
        if self._marks[1]:
            sources |= _INPUT
        if self._host and self._marks[3]:
            sources |= _HOST
        if self._ddp_sums.samples:
            sources |= _DDP
            if self._ddp is not None and self._ddp.device:
                sources |= _DDP_DEVICE
        return sources

    def _publish(self, read: bool) -> None:
        timers = self._ddp
        if read and timers is not None:
            try:
                sums = timers.read()
            except Exception as e:  # noqa: BLE001 - a torch without these internals: no DDP parts
                self._ddp = None
                _warner.warn(f"steps:ddp-read:{type(e).__name__}", f"DDP's timers are not read ({describe(e)})")
                sums = None
            if sums is not None:
                self._ddp_sums = self._ddp_base.plus(sums)
            elif timers is self._ddp and not timers.alive:
                self._ddp = None
        writer = self._writer
        if writer is None:
            return
        s, (input_ns, batches, opt_ns, passes, busy_ns, collective_ns) = self._ddp_sums, self._marks
        writer.write(
            self._measured(), self.steps, self._intervals, self._step_ns, input_ns, batches, opt_ns,
            s.iteration, s.samples, s.rate, s.forward_ns, s.backward_ns, s.wait_ns, s.comm_ns,
            passes, busy_ns, collective_ns,
        )  # fmt: skip
