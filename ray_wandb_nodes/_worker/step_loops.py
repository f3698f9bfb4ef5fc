"""Time every pass of the training loop on the rank's clock, with no user code: what DDP's
sampled timers leave out (the micro-batches of gradient accumulation, DDP's buffer sync, FSDP).

A pass opens a *busy span* on the recorder as its forward starts; the span runs until the next
timed fetch of a batch or the optimizer's step (their clock reads close it), so it holds the
pass's forward and backward (and what the loop does between them: its loss, a gradient clip)
with no hook on the backward and one clock read a pass. Passes are opened by:

- ``torch.nn.parallel.distributed``: ``DistributedDataParallel.forward``; inside it,
  ``_sync_buffers`` (the broadcast of the module's buffers, BatchNorm's running statistics, a
  rotary embedding's ``inv_freq``, from rank 0 at each forward while ``broadcast_buffers`` is
  on, the default) is timed as a wait: a rank late for its input makes the others wait there,
  inside the span DDP's own forward timer counts as compute.
- ``torch.distributed.fsdp._fully_shard._fsdp_state`` (FSDP2, ``fully_shard``): each FSDP
  module's state, as it is made, gets a forward pre-hook that opens a pass; after its first
  forward the hook stays on the root module only.

Waits: the collectives of ``torch.distributed.distributed_c10d`` (``all_reduce``,
``all_gather_single``, ``reduce_scatter_single``, ...; FSDP2 calls them) and ``Work.wait`` are
timed on the training thread while a span is open, and outside one from the first step on (a
collective of the loop's own: the Hugging Face ``Trainer`` all-gathers each step's token count
after its fetch, before its forward, where the others wait for a rank late for its input), but
not inside a fetch or an optimizer's step.

What they add up to (``StepRecorder``): ``busy_ns`` in the spans, ``collective_ns`` blocked in
collectives within them, ``passes``. On a CPU model, busy less its waits is compute; on a GPU the
calls return once their kernels are launched, so these spans say nothing of the device, and the
recorder does not publish them as compute (only the count of passes). Unarmed, each wrapper
calls the original.
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


def timed_pass(current: Current, call: Callable[..., Any], grad_enabled: Callable[[], bool]) -> Any:
    """``call`` (a forward) opening a busy span on the recorder when autograd records (a pass
    under ``no_grad``, an evaluation's, is not training's): the span runs until the next timed
    fetch or the optimizer's step, so it holds the pass's backward with no hook on it."""

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        rec = current.recorder
        if rec is not None and grad_enabled():
            rec.open_pass()
        return call(*args, **kwargs)

    setattr(timed, MARK, True)
    return timed


def timed_wait(current: Current, call: Callable[..., Any]) -> Any:
    """``call`` (a collective, a wait on one) with its time added to the recorder's collective
    time when it blocks on the training thread (one timing a nest): inside a busy span, or outside
    one (the Hugging Face ``Trainer``'s all-gather of the batch's token count before its forward,
    a loss all-reduced for a log), where it counts as busy too, so that compute (busy less waits)
    stays the passes'. Not inside a fetch (input) or an optimizer's step (the optimizer's), nor
    before the first step (set-up's broadcasts)."""
    ident = threading.get_ident

    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        rec = current.recorder
        if rec is None or rec.waiting or rec.inside:
            return call(*args, **kwargs)
        thread, outside = rec.thread, rec.open < 0
        if (thread and thread != ident()) or (outside and (not thread or rec.stepping)):
            return call(*args, **kwargs)
        now = rec.now
        rec.waiting = True
        start = now()
        try:
            return call(*args, **kwargs)
        finally:
            spent = now() - start
            rec.collective_ns += spent
            if outside:
                rec.busy_ns += spent
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
        _wrap(cls, "forward", lambda call: timed_pass(self.current, call, grad))
        _wrap(cls, "_sync_buffers", lambda call: timed_wait(self.current, call))


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
    """The forward hooks of one FSDP2 module: the pre-hook opens a pass while it is the root; after
    its first forward the post-hook takes itself off, and the pre-hook too once it is not the root."""

    def __init__(self, current: Current, state: Any, module: Any, grad: Callable[[], bool]) -> None:
        self._current, self._state, self._grad = current, state, grad
        self._pre = module.register_forward_pre_hook(self.pre, prepend=True)
        self._post = module.register_forward_hook(self.post, always_call=True)

    def pre(self, *_: Any) -> None:
        rec = self._current.recorder
        if rec is not None and self._grad():
            rec.open_pass()

    def post(self, *_: Any) -> None:
        root = getattr(self._state, "_is_root", None)  # set at the first forward
        if root is None:
            return
        self._post.remove()
        if root is False:
            self._pre.remove()
