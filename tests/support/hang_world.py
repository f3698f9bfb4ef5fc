"""A world of hang-test ranks (``tests/support/hang_rank.py``, one process a rank) started and
waited for until they are stuck; for the real-process test and ``bench/hang_evidence.py``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ray_wandb_nodes._hang.beacon import BeaconSlot, progress_of, read_slots


@contextlib.contextmanager
def rank_processes(
    directory: Path, mode: str, world: int, stuck: int, at: int, lib: str = "", env: Mapping[str, str] | None = None
) -> Iterator[None]:
    """``world`` ranks of ``hang_rank.py`` in ``mode``, their beacons and store in ``directory``;
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
