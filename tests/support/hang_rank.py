"""One rank of the hang tests: torch.distributed over gloo on this machine (a FileStore), armed
with the progress beacon and evidence as the plugin arms a Train worker, training a tiny model
one all_reduce a step; the rank named ``stuck`` stops before step ``at``'s all_reduce:

- ``python``: in ``load_next_shard``, a Python loop of ``time.sleep`` (Python can run);
- ``native``: in ``read_from_device``, a C call that keeps the GIL (``gil_holder.c`` via
  ``ctypes.PyDLL``), so no Python thread of the process runs;
- ``all``: every rank stops in ``load_next_shard``;
- ``groups``: four ranks in two process groups besides the default one, ``pair_0_1`` and
  ``pair_2_3`` (as TP groups under a DP one), each step one all_reduce of the gradients in the
  default group, then one all_reduce in ``pair_0_1`` or three in ``pair_2_3`` (their sequence
  numbers part), then one of the loss in the default group; the rank named ``stuck`` stops in
  ``load_next_shard`` after step ``at``'s gradients, before its pair's all_reduces: its pair
  partner waits in the pair's, the other pair in the default group's loss all_reduce.

    python -m tests.support.hang_rank RANK WORLD STORE DIR MODE STUCK AT [GIL_LIB]

The train function runs in a thread named as Ray Train names its own. The step is by hand, with
``Beacon.step()`` as torch's optimizer-step hook would call it: a ``torch.optim`` optimizer pulls
in ``torch._dynamo`` (about 3 s a process); the hook itself is tested in
``tests/unit/hang/test_beacon.py``.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import sys
import threading
import time
from pathlib import Path

from ray_wandb_nodes._hang.beacon import Beacon
from ray_wandb_nodes._hang.evidence import arm
from ray_wandb_nodes._hang.flight import flight_recorder_env


def load_next_shard() -> None:
    while True:
        time.sleep(0.05)  # <load_next_shard>


def read_from_device(lib: str) -> None:
    ctypes.PyDLL(lib).rwn_hold_gil(ctypes.c_double(300.0))  # <read_from_device>


def train_func(rank: int, world: int, store: str, directory: Path, mode: str, stuck: int, at: int, lib: str) -> None:
    import torch
    import torch.distributed as dist

    beacon = Beacon(directory, rank)
    arm(directory, rank, beacon)
    file_store = dist.FileStore(store, world)  # type: ignore[attr-defined]
    dist.init_process_group(
        "gloo", store=file_store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    pair = None
    if mode == "groups":  # every rank creates every group, in one order (torch's rule)
        groups = [dist.new_group([0, 1], group_desc="pair_0_1"), dist.new_group([2, 3], group_desc="pair_2_3")]
        pair = groups[rank // 2]
    model = torch.nn.Linear(4, 1)
    for step in range(at + 1):
        if step == at and (rank == stuck or mode == "all") and mode != "groups":
            if mode == "native":
                read_from_device(lib)
            else:
                load_next_shard()
        loss = model(torch.ones(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        dist.all_reduce(grads)  # <all_reduce>
        if pair is not None:
            if step == at and rank == stuck:
                load_next_shard()
            for _ in range(1 if rank < 2 else 3):
                dist.all_reduce(grads, group=pair)  # <pair_all_reduce>
            dist.all_reduce(loss.detach())  # <loss_all_reduce>
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(0.01 * param.grad)  # type: ignore[operator]
        beacon.step()
        beacon.report()


def main() -> None:
    rank, world, store, directory, mode, stuck, at = sys.argv[1:8]
    lib = sys.argv[8] if len(sys.argv) > 8 else ""
    os.environ.update(flight_recorder_env(256, environ=os.environ))  # before the process group exists
    args = (int(rank), int(world), store, Path(directory), mode, int(stuck), int(at), lib)
    thread = threading.Thread(target=train_func, args=args, name="TrainingThread(train_func)", daemon=True)
    thread.start()
    thread.join()


if __name__ == "__main__":
    main()
