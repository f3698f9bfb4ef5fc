"""Two real ranks over gloo running the loop kinds of ``_worker.step_loops`` with the rank's step
anatomy armed, one case after another in one process group, each case's totals read at two steps.

    python -m tests.support.loop_ranks --rank R --world 2 --store FILE --out FILE --cases ddp_bn:input:1,...

A case is ``kind:slow:rank`` (``slow`` one of ``none``, ``input``, ``compute``): ``ddp_bn`` a DDP
over a model with BatchNorm (its buffers broadcast at every forward, DDP's default); ``accum`` a
DDP stepping once every :data:`ACCUMULATE` micro-batches, the others under ``no_sync()``;
``fsdp2`` a model sharded with ``fully_shard``; ``ddp_count`` a DDP whose loop all-reduces between
the fetch and the pass (as the Hugging Face ``Trainer`` all-gathers each batch's token count);
``lightning`` the model in Lightning's ``Trainer`` (its loops, its DDP strategy), ``lightning_accum``
the same accumulating :data:`ACCUMULATE` batches a step;
a kind ending in ``_compiled`` the same model under ``torch.compile`` (dynamo, with its eager
backend: no C++ build). Every pass computes for :data:`PASS_S` (a sleep inside the forward: the
host's clock cannot tell it from compute), the slow rank :data:`SLOW_S` more in its input (each
batch) or its compute (each pass). The output: for each
case, the totals (``StepTotals`` as a list) at step :data:`FIRST` and at the last step.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

ACCUMULATE = 4
PASS_S = 0.02
SLOW_S = 0.03
FIRST, STEPS = 12, 40  # DDP times every iteration of its first ten, then one in 13 on a CPU: 3 here


def run_case(kind: str, slow: str, slow_rank: int, rank: int) -> list[list[int]]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    from ray_wandb_nodes._worker.steps import arm_steps, disarm_steps

    extra_input = SLOW_S if slow == "input" and rank == slow_rank else 0.0
    extra_compute = SLOW_S if slow == "compute" and rank == slow_rank else 0.0

    class Batches(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> torch.Tensor:
            if extra_input:
                time.sleep(extra_input)
            return torch.randn(8, 16)

    class Busy(torch.nn.Module):  # a pass's compute: the same on every rank, more on a slow one
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(PASS_S + extra_compute)
            return x

    recorder = arm_steps(bytearray(256))
    torch.manual_seed(0)
    if kind.startswith("lightning"):
        micro = ACCUMULATE if kind == "lightning_accum" else 1
        reads = lightning_case(Busy(), DataLoader(Batches(), batch_size=None), recorder, micro)
        disarm_steps()
        dist.barrier()
        return reads
    layers: list[torch.nn.Module] = [torch.nn.Linear(16, 16), Busy(), torch.nn.Linear(16, 1)]
    if kind.startswith("ddp_bn"):
        layers.insert(1, torch.nn.BatchNorm1d(16))
    body = torch.nn.Sequential(*layers)
    model: Any
    if kind.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        fully_shard(body[0])
        fully_shard(body[2])
        model = fully_shard(body)
    else:
        model = DistributedDataParallel(body)
    if kind.endswith("_compiled"):  # dynamo over the whole model (its eager backend: no C++ build)
        model = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    micro = ACCUMULATE if kind.startswith("accum") else 1
    batches = iter(DataLoader(Batches(), batch_size=None))
    reads = []
    dist.barrier()
    for step in range(1, STEPS + 1):
        for i in range(micro):
            x = next(batches)
            if kind == "ddp_count":  # a collective between the fetch and the pass (HF's token count)
                dist.all_reduce(torch.ones(1))
            if i < micro - 1:
                with model.no_sync():
                    model(x).pow(2).mean().backward()
            else:
                model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step in (FIRST, STEPS):
            reads.append(list(dataclasses.astuple(recorder.publish())))
    disarm_steps()
    dist.barrier()
    return reads


def lightning_case(busy: Any, loader: Any, recorder: Any, micro: int = 1) -> list[list[int]]:
    """Lightning's own loops (its fit loop, its data fetcher's prefetch, its DDP strategy over the
    process group already made) over the same model and batches, for :data:`STEPS` steps of
    ``micro`` batches each (``accumulate_grad_batches``: its own ``no_sync()`` path)."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    reads: list[list[int]] = []

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 16), busy, torch.nn.Linear(16, 1))

        def training_step(self, batch: Any, index: int) -> Any:
            return self.body(batch).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.001)

    read_at: set[int] = set()

    class Read(pl.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:  # after each micro-batch
            if trainer.global_step in (FIRST, STEPS) and trainer.global_step not in read_at:
                read_at.add(trainer.global_step)  # the step's optimizer step just ran: once a step
                reads.append(list(dataclasses.astuple(recorder.publish())))

    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(), max_steps=STEPS, callbacks=[Read()],
        accumulate_grad_batches=micro,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Module(), loader)
    return reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # Lightning's environment: these processes are its ranks, started outside it (the group is made below)
    os.environ.update(LOCAL_RANK=str(args.rank), NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    store = dist.FileStore(args.store, args.world)  # type: ignore[attr-defined]
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world, timeout=timeout)
    out = {}
    for case in args.cases.split(","):
        kind, slow, slow_rank = case.split(":")
        out[case] = run_case(kind, slow, int(slow_rank), args.rank)
    dist.destroy_process_group()
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
