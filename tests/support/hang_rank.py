"""One rank of the hang tests: torch.distributed over gloo on this machine (a FileStore), armed
with the progress beacon and evidence as the plugin arms a Train worker, training a tiny model
one all_reduce a step; the rank named ``stuck`` stops before step ``at``'s all_reduce:

- ``python``: in ``load_next_shard``, a Python loop of ``time.sleep`` (Python can run);
- ``native``: in ``read_from_device``, a C call that keeps the GIL (``gil_holder.c`` via
  ``ctypes.PyDLL``), so no Python thread of the process runs;
- ``all``: every rank stops in ``load_next_shard``.

    python -m tests.support.hang_rank RANK WORLD STORE DIR MODE STUCK AT [GIL_LIB]

:func:`rank_processes` starts a world of them, :func:`settled` waits until they are stuck.

The train function runs in a thread named as Ray Train names its own. The step is by hand, with
``Beacon.step()`` as torch's optimizer-step hook would call it: a ``torch.optim`` optimizer pulls
in ``torch._dynamo`` (about 3 s a process); the hook itself is tested in
``tests/unit/test_hang_beacon.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ray_wandb_nodes._hang.beacon import Beacon, BeaconSlot, progress_of, read_slots
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
    model = torch.nn.Linear(4, 1)
    for step in range(at + 1):
        if step == at and (rank == stuck or mode == "all"):
            if mode == "native":
                read_from_device(lib)
            else:
                load_next_shard()
        loss = model(torch.ones(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        dist.all_reduce(grads)  # <all_reduce>
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


@contextlib.contextmanager
def rank_processes(
    directory: Path, mode: str, world: int, stuck: int, at: int, lib: str = "", env: Mapping[str, str] | None = None
) -> Iterator[None]:
    """``world`` ranks of this script in ``mode``, their beacons and store in ``directory``;
    each killed by its pid at the end."""
    repo = Path(__file__).resolve().parents[2]
    environ = {**(os.environ if env is None else env), "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    procs = []
    try:
        for rank in range(world):
            cmd = [sys.executable, "-m", "tests.support.hang_rank", str(rank), str(world), str(directory / "store")]
            cmd += [str(directory), mode, str(stuck), str(at), lib]
            procs.append(
                subprocess.Popen(cmd, env=environ, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def settled(directory: Path, world: int, at: int, quiet_s: float = 1.0, timeout_s: float = 60.0) -> list[BeaconSlot]:
    """The slots once every rank reached step ``at``, armed, and has been silent ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        slots = read_slots(directory)
        now = time.monotonic_ns()
        if (
            len(slots) == world
            and all(s.steps == at and s.dump_signal for s in slots)
            and all(progress_of(s, now).age_s >= quiet_s for s in slots)
        ):
            return slots
        time.sleep(0.1)
    raise AssertionError(f"ranks did not settle at step {at}: {read_slots(directory)}")


if __name__ == "__main__":
    main()
