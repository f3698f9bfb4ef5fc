"""DDP's own reducer timers, reached with no user code: every ``DistributedDataParallel`` made in
an armed process is handed to the rank's recorder as it is made (``__init__`` wrapped once torch
is imported, through ``_on_import``), whether the user, Ray's ``prepare_model``, the Hugging Face
``Trainer`` (through Accelerate) or Lightning's DDP strategy makes it.

What the timers give (torch ``reducer.cpp``, ``logger.cpp``; checked on torch 2.13): on every
*sampled* iteration (the first ten, then one in ``sample rate``), the time from forward's start
to backward's first gradient, backward compute, all of communication, and its overlap with
compute; the logger keeps running means of each over the sampled iterations. Exposed
communication (``backward_comm_time_end - backward_compute_time_end``) is communication less its
overlap, and a running mean of it is the difference of two running means. Times are one
process's clock (CPU) or CUDA events on its device: differences on one rank only.

The rate: on CPU a sampled iteration costs a few clock reads and map writes in C++ (about 2 us
on the project's machine, ``bench/step_anatomy_cost.py``), so the timers sample one iteration in
:data:`CPU_RATE`. On CUDA a sampled iteration synchronises the
device at the next forward (the timers' CUDA events are waited for); at worst that costs one
step's overlap of host and device, so one in :data:`CUDA_RATE` keeps the step within 0.5 %.
Both rates are prime, so that a period in the data (one slow loader worker of eight) does not
alias with the sampled iterations. Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` DDP logs every
sampled iteration: the rate is then left as the user has it.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

CPU_RATE = 13  # a timed iteration costs ~2 us of C++ here: 0.15 us a step
CUDA_RATE = 211  # >= 200: one device sync (at worst one step) in 200 steps is 0.5 %
FIRST_SAMPLED = 10  # DDP times each of its first ten iterations whatever the rate
TORCH_DEFAULT_RATE = 100  # kDDPRuntimeLoggingSampleRate
MARK = "_ray_wandb_nodes_steps"
_AVERAGES = (
    "avg_forward_compute_time",
    "avg_backward_compute_time",
    "avg_backward_comm_time",
    "avg_backward_compute_comm_overlap_time",
)


@dataclass(frozen=True)
class DdpSums:
    """DDP's timers as running totals: the sums over the ``samples`` iterations it timed among
    its first ``iteration`` (nanoseconds, on the rank's clock or its device's)."""

    iteration: int
    samples: int
    rate: int
    forward_ns: int
    backward_ns: int
    wait_ns: int
    comm_ns: int

    def plus(self, later: DdpSums) -> DdpSums:
        """These totals followed by a later DDP's (a model wrapped again): counts and sums add up,
        the rate is the later's."""
        return DdpSums(
            self.iteration + later.iteration,
            self.samples + later.samples,
            later.rate,
            self.forward_ns + later.forward_ns,
            self.backward_ns + later.backward_ns,
            self.wait_ns + later.wait_ns,
            self.comm_ns + later.comm_ns,
        )


def sampled_iterations(iteration: int, rate: int) -> int:
    """How many of the first ``iteration`` iterations DDP timed at ``rate``: each of the first
    ten, then every ``rate``-th (``Reducer::should_collect_runtime_stats``)."""
    if iteration <= FIRST_SAMPLED:
        return max(0, iteration)
    return FIRST_SAMPLED + iteration // rate - FIRST_SAMPLED // rate


def ddp_sums(ints: Mapping[str, int], rate: int) -> DdpSums | None:
    """The running totals in DDP's logging data (its ``ints_map``), timed at ``rate``; None
    before DDP has timed an iteration (its averages are set at the forward after one)."""
    iteration = int(ints.get("iteration", 0) or 0)
    if iteration <= 0 or any(key not in ints for key in _AVERAGES):
        return None
    n = sampled_iterations(iteration, rate)
    forward, backward, comm, overlap = (int(ints[key]) for key in _AVERAGES)
    # A running mean times its count is the sum less what each update's integer division dropped:
    # under k ns at the k-th update, (k - 1) / 2 on average, so n (n - 1) / 4 in all (added back).
    # Exposed wait is a difference of two such means: what they dropped cancels on average.
    dropped = n * (n - 1) // 4
    return DdpSums(
        iteration=iteration,
        samples=n,
        rate=rate,
        forward_ns=forward * n + dropped,
        backward_ns=backward * n + dropped,
        wait_ns=max(0, comm - overlap) * n,
        comm_ns=comm * n + dropped,
    )


def rate_for(device_type: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The sample rate to set for a DDP on ``device_type``; None: leave DDP's own."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
        return None
    return CPU_RATE if device_type == "cpu" else CUDA_RATE


class DdpTimers:
    """One DDP instance's timers, read on the rank (held by a weak reference: a DDP the user
    drops is not kept alive)."""

    def __init__(self, ddp: Any, rate: int, device: bool) -> None:
        self._ref = weakref.ref(ddp)
        self.rate = rate
        self.device = device  # CUDA events: device time

    @classmethod
    def attach(cls, ddp: Any) -> DdpTimers | None:
        """Set ``ddp``'s sample rate and read its timers from now on; None where this DDP keeps
        no timers (the Python reducer, a module whose reduction is delayed, no logger)."""
        if getattr(ddp, "logger", None) is None or getattr(ddp, "reducer", None) is None:
            return None
        if getattr(ddp, "_use_python_reducer", False) or getattr(ddp, "_delay_all_reduce_all_params", False):
            return None
        device_type = str(getattr(ddp, "device_type", "cpu"))
        rate = rate_for(device_type)
        if rate is None:
            rate = TORCH_DEFAULT_RATE
        else:
            ddp._set_ddp_runtime_logging_sample_rate(rate)
        return cls(ddp, rate, device=device_type != "cpu")

    @property
    def alive(self) -> bool:
        return self._ref() is not None

    def read(self) -> DdpSums | None:
        """The running totals now (a C++ copy of DDP's logging data: a few microseconds, taken at
        most every ``READ_EVERY`` steps by the recorder); None before DDP timed an iteration, or once
        the DDP is gone."""
        ddp = self._ref()
        if ddp is None:
            return None
        return ddp_sums(ddp.logger._get_ddp_logging_data().ints_map, self.rate)


# the patch --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PatchDdp:
    """A patch for ``_on_import`` on ``torch.nn.parallel.distributed``: every DDP made from now on
    is passed to ``attach`` once made (a DDP whose construction raised is not). Equal patches are
    one: awaited once."""

    attach: Callable[[Any], None]

    def __call__(self, module: ModuleType) -> None:
        cls = getattr(module, "DistributedDataParallel", None)
        init = getattr(cls, "__init__", None)
        if cls is None or init is None or getattr(init, MARK, False):
            return
        attach = self.attach

        @functools.wraps(init)
        def init_then_attach(ddp: Any, *args: Any, **kwargs: Any) -> None:
            init(ddp, *args, **kwargs)
            attach(ddp)

        setattr(init_then_attach, MARK, True)
        cls.__init__ = init_then_attach
