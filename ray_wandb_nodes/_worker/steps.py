"""Arming a rank's step anatomy: one recorder a process, written into the region its beacon slot
keeps for it, and the hooks that feed it, each put in place once its module is imported (before
or after this call: ``_on_import``), so that a job without torch pays nothing:

- ``torch.optim.optimizer``: the global optimizer-step pre- and post-hooks (every optimizer);
- ``torch.utils.data.dataloader`` and ``ray.data.iterator``: ``next()`` timed (``inputs``);
- ``torch.nn.parallel.distributed``: every DDP made is read for its timers (``ddp``), and its
  passes and buffer syncs are timed (``step_loops``), as are FSDP2's root passes and the
  collectives of ``torch.distributed`` blocked in within a pass.

Disarming removes the optimizer hooks and publishes the last totals; the patched methods stay
(they cannot be taken back safely while an iterator may be inside one) and pass through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._steps.ddp import PatchDdp
from .._steps.recorder import StepRecorder
from .._steps.region import RegionWriter
from .on_import import when_imported
from .step_inputs import Current, TimeDataLoaders, TimeRayData
from .step_loops import TimeCollectives, TimeDdpPasses, TimeFsdpPasses

CURRENT = Current()
_removers: list[Callable[[], None]] = []
_owner: list[object | None] = [None]  # what the armed recorder writes into (its beacon)


def arm_steps(region: memoryview | bytearray | None, owner: object | None = None) -> StepRecorder:
    """Arm this process's step anatomy, written into ``region`` (a writable buffer of 256 bytes:
    the beacon's step region; None: kept in the process only, for tests). Idempotent: a second
    call returns the recorder armed first, unless it names another ``owner`` (the beacon the
    region is part of: a rank armed again in another attempt's folder), which disarms the first."""
    if CURRENT.recorder is not None:
        if owner is None or owner is _owner[0]:
            return CURRENT.recorder
        disarm_steps()
    recorder = StepRecorder(RegionWriter(region) if region is not None else None)
    CURRENT.recorder = recorder
    _owner[0] = owner
    when_imported("torch.optim.optimizer", HookOptimizers(CURRENT))
    when_imported("torch.utils.data.dataloader", TimeDataLoaders(CURRENT))
    when_imported("torch.nn.parallel.distributed", PatchDdp(_attach))
    when_imported("torch.nn.parallel.distributed", TimeDdpPasses(CURRENT))
    when_imported("torch.distributed.distributed_c10d", TimeCollectives(CURRENT))
    when_imported("torch.distributed.fsdp._fully_shard._fsdp_state", TimeFsdpPasses(CURRENT, _attach_loop))
    when_imported("ray.data.iterator", TimeRayData(CURRENT))
    when_imported("ray.data.dataset", TimeRayData(CURRENT, "Dataset"))
    return recorder


def armed_steps() -> StepRecorder | None:
    return CURRENT.recorder


def disarm_steps() -> None:
    """The worker's end: the last totals published, the optimizer hooks removed, the region let go."""
    recorder, CURRENT.recorder, _owner[0] = CURRENT.recorder, None, None
    while _removers:
        with contextlib.suppress(Exception):
            _removers.pop()()
    if recorder is not None:
        recorder.publish()
        recorder.close()


def _attach(ddp: Any) -> None:
    recorder = CURRENT.recorder
    if recorder is not None:
        recorder.attach_ddp(ddp)
        recorder.attach_loop(str(getattr(ddp, "device_type", "cpu")))


def _attach_loop(device_type: str) -> None:
    recorder = CURRENT.recorder
    if recorder is not None:
        recorder.attach_loop(device_type)


@dataclass(frozen=True)
class HookOptimizers:
    """The patch on ``torch.optim.optimizer``: the recorder's optimizer hooks, process-wide."""

    current: Current

    def __call__(self, module: ModuleType) -> None:
        recorder = self.current.recorder
        pre = getattr(module, "register_optimizer_step_pre_hook", None)
        post = getattr(module, "register_optimizer_step_post_hook", None)
        if recorder is None or pre is None or post is None:
            return  # torch before 2.0: no global hooks, no optimizer part
        _removers.append(pre(recorder.optimizer_pre).remove)
        _removers.append(post(recorder.optimizer_post).remove)
        recorder.hooks_in_place()
