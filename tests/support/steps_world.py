"""A world of slow-rank test ranks (``tests/support/steps_rank.py``, one process a rank), and the
node's side of them: every rank's step region read from outside (one ``pread`` of the slot's
bytes 256-511, as the beacon's reader hands them over) while they run, each read kept by the
step count it covers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ray_wandb_nodes._steps import StepTotals, decode

from .steps_rank import REGION_AT

REPO = Path(__file__).resolve().parents[2]
POLL_S = 0.01  # well under a step (100 ms and more): every published step is read


@contextlib.contextmanager
def rank_processes(directory: Path, world: int, phases: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``world`` ranks running ``phases``; each killed by its pid if the test ends before them."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            cmd = [sys.executable, "-m", "tests.support.steps_rank", str(rank), str(world), str(directory / "store")]
            cmd += [str(directory), phases]
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


def read_region(path: Path) -> StepTotals | None:
    """One rank's totals, read as the node reads them; None until its first publish, or torn."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return decode(os.pread(fd, 256, REGION_AT))
    finally:
        os.close(fd)


def follow(directory: Path, procs: list[subprocess.Popen[bytes]], timeout_s: float) -> dict[int, dict[int, StepTotals]]:
    """Every rank's reads until every process has exited: rank -> step count -> its totals."""
    seen: dict[int, dict[int, StepTotals]] = {rank: {} for rank in range(len(procs))}
    deadline = time.monotonic() + timeout_s
    while True:
        done = all(p.poll() is not None for p in procs)  # before the read: the last one is read after
        for rank in seen:
            totals = read_region(directory / f"rank-{rank}.steps")
            if totals is not None:
                seen[rank][totals.steps] = totals
        if done:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"ranks still running after {timeout_s:.0f}s")
        time.sleep(POLL_S)
    failed = [(i, p.returncode, (p.stderr.read() if p.stderr else b"")[-2000:]) for i, p in enumerate(procs)]
    assert all(code == 0 for _, code, _ in failed), failed
    return seen
