"""One rank of the slow-rank tests: torch.distributed over gloo on this machine (a FileStore), its
step anatomy armed as the plugin arms a Train worker (``arm_steps`` on the 256 bytes at offset 256
of a 512-byte slot file, as the beacon's version-2 slot keeps them), training a small DDP model
from a ``DataLoader``, with no code of the plugin's in the loop. The run goes through phases::

    python -m tests.support.steps_rank RANK WORLD STORE DIR PHASES

``PHASES`` is ``kind:rank:steps`` separated by commas: in a phase of kind ``input`` that rank's
dataset sleeps :data:`SLOW_S` more in ``__getitem__``, in one of kind ``forward`` its model's
forward does; ``balanced`` slows nobody (the rank is ignored). Every rank's dataset sleeps
:data:`BASE_S` a batch, so that a step is long beside the machine's scheduling noise.
"""

from __future__ import annotations

import datetime
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any

from ray_wandb_nodes._worker.steps import arm_steps, disarm_steps

BASE_S = 0.1  # every rank's input a batch: steps of 100 ms and up (each published), long beside scheduling noise
SLOW_S = 0.2
SLOT_SIZE, REGION_AT = 512, 256


class Plan:
    """Which phase the rank is in; the dataset and the model read it."""

    def __init__(self, rank: int, phases: str) -> None:
        self.rank = rank
        self.steps: list[tuple[str, int]] = []
        for part in phases.split(","):
            kind, who, steps = part.split(":")
            self.steps += [(kind, int(who))] * int(steps)
        self.step = 0

    def slowed(self, kind: str) -> bool:
        phase, who = self.steps[min(self.step, len(self.steps) - 1)]
        return phase == kind and who == self.rank


def slot_region(directory: Path, rank: int) -> tuple[mmap.mmap, memoryview]:
    fd = os.open(directory / f"rank-{rank}.steps", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, SLOT_SIZE)
        mapping = mmap.mmap(fd, SLOT_SIZE)
    finally:
        os.close(fd)
    return mapping, memoryview(mapping)[REGION_AT:SLOT_SIZE]


def main() -> None:
    rank, world, store, directory, phases = sys.argv[1:6]
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    plan = Plan(int(rank), phases)
    mapping, region = slot_region(Path(directory), int(rank))
    arm_steps(region)  # after torch's import: the hooks go in at once (the other order: unit tests)

    class Batches(Dataset[Any]):
        def __len__(self) -> int:
            return len(plan.steps) + 1

        def __getitem__(self, index: int) -> Any:
            time.sleep(BASE_S + (SLOW_S if plan.slowed("input") else 0.0))  # <slow input>
            return torch.ones(8, 16)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x: Any) -> Any:
            if plan.slowed("forward"):
                time.sleep(SLOW_S)  # <slow forward>
            return self.body(x)

    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, int(world)),  # type: ignore[attr-defined]
        rank=int(rank),
        world_size=int(world),
        timeout=datetime.timedelta(seconds=120),
    )
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Batches(), batch_size=None))
    for step in range(len(plan.steps)):
        plan.step = step
        loss = model(next(batches)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    disarm_steps()  # the last totals published
    dist.destroy_process_group()
    region.release()
    mapping.close()


if __name__ == "__main__":
    main()
