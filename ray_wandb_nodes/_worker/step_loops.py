"""Time every pass of the training loop on the rank's clock, with no user code: what DDP's
sampled timers leave out (the micro-batches of gradient accumulation, DDP's buffer sync, FSDP).

- ``torch.nn.parallel.distributed``: ``DistributedDataParallel.forward`` (one pass: a micro-batch)
  and, inside it, ``_sync_buffers`` (the broadcast of the module's buffers, BatchNorm's running
  statistics, a rotary embedding's ``inv_freq``, from rank 0 at each forward while
  ``broadcast_buffers`` is on, the default): a rank late for its input makes the others wait
  here, inside the span DDP's forward timer counts as compute; timed apart, it is a wait.
- ``torch.distributed.fsdp._fully_shard._fsdp_state`` (FSDP2, ``fully_shard``): each FSDP
  module's state, as it is made, gets a forward pre-hook and a forward hook; after its first
  forward the hooks stay on the root module only (the others' take themselves off), which then
  times one pass a forward.
- ``torch.autograd``: ``backward`` (``Tensor.backward`` calls it; so do Accelerate's,
  Lightning's and the Hugging Face ``Trainer``'s backward): every backward call.
- ``torch.distributed.distributed_c10d``: the collectives FSDP and users call (``all_reduce``,
  ``all_gather_single``, ``reduce_scatter_single``, ...) and ``Work.wait``: the time blocked in
  them inside a timed pass or backward.

What they add up to (``StepRecorder``): ``busy_ns`` inside passes and backward calls (one span
a nest: a backward inside a pass, a pass inside a pass are timed once), ``collective_ns`` blocked
in collectives within them, ``passes``. On a CPU model, busy less its collectives is compute and
the collectives are waits; on a GPU the calls return once their kernels are launched, so these
spans say nothing of the device, and the recorder does not publish them as compute (only the
count of passes). Timed on the training thread only; unarmed, each wrapper calls the original.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .step_inputs import Current

MARK = "_ray_wandb_nodes_pass"
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "all_to_all_single",
    "barrier",
)


def timed_pass(current: Current, call: Callable[..., Any], grad_enabled: Callable[[], bool], count: int) -> Any:
    """``call`` with its time added to the recorder's busy time, ``count`` passes with it, when
    autograd records (a pass under ``no_grad``, an evaluation's, is not training's)."""
    ident = threading.get_ident

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        rec = current.recorder
        if rec is None or rec.busy or (rec.thread and rec.thread != ident()) or not grad_enabled():
            return call(*args, **kwargs)
        now = rec.now
        rec.busy = True
        start = now()
        try:
            return call(*args, **kwargs)
        finally:
            rec.busy_ns += now() - start
            rec.passes += count
            rec.busy = False

    setattr(timed, MARK, True)
    return timed


def timed_wait(current: Current, call: Callable[..., Any]) -> Any:
    """``call`` (a collective, a wait on one) with its time added to the recorder's collective
    time when it blocks inside a timed pass (one span a nest)."""
    ident = threading.get_ident

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        rec = current.recorder
        if rec is None or not rec.busy or rec.waiting or (rec.thread and rec.thread != ident()):
            return call(*args, **kwargs)
        now = rec.now
        rec.waiting = True
        start = now()
        try:
            return call(*args, **kwargs)
        finally:
            rec.collective_ns += now() - start
            rec.waiting = False

    setattr(timed, MARK, True)
    return timed


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Any]) -> bool:
    """``owner.name`` replaced by ``make(it)`` once; False where there is none to wrap."""
    original = getattr(owner, name, None)
    if original is None or not callable(original) or getattr(original, MARK, False):
        return False
    setattr(owner, name, make(original))
    return True


@dataclass(frozen=True)
class TimeDdpPasses:
    """The patch on ``torch.nn.parallel.distributed``: DDP's forward a pass, its buffer sync a wait."""

    current: Current

    def __call__(self, module: ModuleType) -> None:
        import torch

        cls = getattr(module, "DistributedDataParallel", None)
        if cls is None:
            return
        grad = torch.is_grad_enabled
        _wrap(cls, "forward", lambda call: timed_pass(self.current, call, grad, 1))
        _wrap(cls, "_sync_buffers", lambda call: timed_wait(self.current, call))


@dataclass(frozen=True)
class TimeBackward:
    """The patch on ``torch.autograd``: every ``backward`` call is busy time (no pass)."""

    current: Current

    def __call__(self, module: ModuleType) -> None:
        _wrap(module, "backward", lambda call: timed_pass(self.current, call, lambda: True, 0))


@dataclass(frozen=True)
class TimeCollectives:
    """The patch on ``torch.distributed.distributed_c10d``: its collectives and ``Work.wait``
    (also where ``torch.distributed`` has taken the same functions already)."""

    current: Current

    def __call__(self, module: ModuleType) -> None:
        import sys

        package = sys.modules.get("torch.distributed")
        for name in COLLECTIVES:
            original = getattr(module, name, None)
            if _wrap(module, name, lambda call: timed_wait(self.current, call)) and package is not None:
                if getattr(package, name, None) is original:
                    setattr(package, name, getattr(module, name))
        work = getattr(module, "Work", None)
        if work is not None:
            _wrap(work, "wait", lambda call: timed_wait(self.current, call))


@dataclass(frozen=True)
class TimeFsdpPasses:
    """The patch on FSDP2's state (``torch.distributed.fsdp._fully_shard._fsdp_state``): the
    root module's forward a pass; ``attach(device_type)`` told of each FSDP2 model's device."""

    current: Current
    attach: Callable[[str], None]

    def __call__(self, module: ModuleType) -> None:
        import torch

        cls = getattr(module, "FSDPState", None)
        init = getattr(cls, "init", None)
        if cls is None or init is None or getattr(init, MARK, False):
            return
        current, attach, grad = self.current, self.attach, torch.is_grad_enabled

        @functools.wraps(init)
        def init_then_time(state: Any, modules: Any, device: Any, *args: Any, **kwargs: Any) -> None:
            init(state, modules, device, *args, **kwargs)
            attach(str(getattr(device, "type", device)))
            if len(modules) == 1:
                _RootPass(current, state, modules[0], grad)

        setattr(init_then_time, MARK, True)
        cls.init = init_then_time


class _RootPass:
    """The forward hooks of one FSDP2 module: they time its forward while it is the root, and
    take themselves off after its first forward once it is not."""

    def __init__(self, current: Current, state: Any, module: Any, grad: Callable[[], bool]) -> None:
        self._current, self._state, self._grad = current, state, grad
        self._start = -1
        self._ident = threading.get_ident
        self._pre = module.register_forward_pre_hook(self.pre, prepend=True)
        self._post = module.register_forward_hook(self.post, always_call=True)

    def pre(self, *_: Any) -> None:
        rec = self._current.recorder
        if rec is None or rec.busy or (rec.thread and rec.thread != self._ident()) or not self._grad():
            return
        rec.busy = True
        self._start = rec.now()

    def post(self, *_: Any) -> None:
        rec = self._current.recorder
        start, self._start = self._start, -1
        if rec is not None and start >= 0:
            rec.busy_ns += rec.now() - start
            rec.passes += 1
            rec.busy = False
        if getattr(self._state, "_is_root", None) is False:  # set at the first forward: not the root
            self._pre.remove()
            self._post.remove()
