"""One rank of the failure tests: torch.distributed over gloo on this machine (a FileStore), one
all_reduce a step, its train function run by Ray Train's own ``ThreadRunner`` with the plugin's
hook on it (``_ray.failures.hook_train_errors``) writing the rank's record beside its beacons,
as a Train worker is set up. At step ``AT`` the rank named ``BAD`` (or, in ``two``, ranks 1 and 3)
ends in ``MODE``:

- ``kill``: SIGKILLs itself (as the kernel's OOM killer kills): no Python runs;
- ``raise``: raises ``ValueError("bad shard 17")`` in ``load_shard`` and its process stays up
  ``HOLD`` seconds, as a Ray actor does after its train function raised: the others wait in
  all_reduce until gloo's timeout (``TIMEOUT`` seconds);
- ``exit``: raises as in ``raise``, then its process exits: the others' connections close;
- ``two``: ranks 1 and 3 raise at once, a ``ValueError`` and a ``KeyError``, and exit.

A rank whose all_reduce fails raises that error out of its train function, as it would in Ray.

    python -m tests.support.crash_rank RANK WORLD STORE DIR MODE BAD AT TIMEOUT HOLD
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from pathlib import Path


def load_shard(index: int) -> None:
    raise ValueError(f"bad shard {index}")  # <load_shard>


def read_labels(name: str) -> None:
    labels: dict[str, int] = {}
    labels[name] += 1  # <read_labels>


def train_func(rank: int, world: int, store: str, mode: str, bad: int, at: int, timeout: float) -> None:
    import torch
    import torch.distributed as dist

    file_store = dist.FileStore(store, world)  # type: ignore[attr-defined]
    dist.init_process_group(
        "gloo", store=file_store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
    )
    for step in range(at + 3):
        if step == at:
            if mode == "kill" and rank == bad:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode in ("raise", "exit") and rank == bad:
                load_shard(17)
            if mode == "two" and rank == 1:
                load_shard(17)
            if mode == "two" and rank == 3:
                read_labels("cat")
        dist.all_reduce(torch.ones(4))  # <all_reduce>
        time.sleep(0.05)


def main() -> None:
    rank, world, store, directory, mode, bad, at, timeout, hold = sys.argv[1:10]
    import torch.distributed  # noqa: F401 - imported before the train function, as a Train worker has it
    from ray.train.v2._internal.execution.worker_group.thread_runner import ThreadRunner

    from ray_wandb_nodes._failure import RankRecorder
    from ray_wandb_nodes._ray.failures import hook_train_errors

    recorder = RankRecorder(Path(directory), int(rank))
    assert hook_train_errors(recorder.raised)
    runner = ThreadRunner()
    args = (int(rank), int(world), store, mode, int(bad), int(at), float(timeout))
    runner.run(lambda: train_func(*args))
    while runner.is_running():
        time.sleep(0.01)
    error = runner.get_error()
    if error is None:
        return
    # Ray's worker stays up after its train function raised; here the raiser holds as long.
    if mode == "raise" and int(rank) == int(bad):
        time.sleep(float(hold))
    sys.exit(1)


if __name__ == "__main__":
    main()
