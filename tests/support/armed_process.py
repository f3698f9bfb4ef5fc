"""A process armed as a train rank is (beacon, faulthandler, dump thread), for the tests of when a
node signals a rank (``tests/unit/hang/test_signal.py``); it prints ``ready`` once armed, then:

- ``gil``: holds the GIL in a C call (``gil_holder.c``) until RELEASE exists, so no Python runs
  (the call creates RELEASE.held once it holds it);
- ``python``: runs Python (a loop of ``time.sleep``) until RELEASE exists;
- ``unregistered``: unregisters faulthandler's signal after arming (its slot still records it),
  then holds the GIL in C as ``gil`` does.

    python -m tests.support.armed_process FOLDER RANK MODE RELEASE [GIL_LIB]

:func:`running` starts one for a test and kills it by its pid at the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ray_wandb_nodes._hang.beacon import Beacon
from ray_wandb_nodes._hang.evidence import arm
from ray_wandb_nodes._hang.slot import BeaconSlot, read_slots
from tests.support.wait import wait_until

REPO = Path(__file__).resolve().parents[2]


def hold_gil_in_c(lib: str, release: str) -> None:
    held = (release + ".held").encode()
    ctypes.PyDLL(lib).rwn_hold_gil_ready(held, release.encode(), ctypes.c_double(120.0))  # <hold_gil_in_c>


def run_python(release: str) -> None:
    while not os.path.exists(release):
        time.sleep(0.01)  # <run_python>


def main() -> None:
    folder, rank, mode, release = sys.argv[1:5]
    lib = sys.argv[5] if len(sys.argv) > 5 else ""
    beacon = Beacon(Path(folder), int(rank))
    armed = arm(Path(folder), int(rank), beacon)
    beacon.step()  # its progress, from this (the "training") thread
    if mode == "unregistered":
        faulthandler.unregister(armed.signum)  # the default action again: the signal would end it
    print("ready", flush=True)
    if mode == "python":
        run_python(release)
    else:
        hold_gil_in_c(lib, release)
    time.sleep(60)  # released: the dump thread answers what is still in its FIFO


@contextlib.contextmanager
def running(folder: Path, mode: str, lib: str = "") -> Iterator[tuple[subprocess.Popen[str], BeaconSlot, Path]]:
    """A process of this module in ``mode`` as rank 0 of ``folder``, its slot, and the file that
    releases it; killed by its pid at the end."""
    release = folder / "release"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.armed_process", str(folder), "0", mode, str(release), lib],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        if mode != "python":  # the C call holds the GIL from here on
            wait_until(lambda: Path(f"{release}.held").exists(), 20, "the C call that holds the GIL")
        [slot] = read_slots(folder)
        assert slot.dump_signal
        yield proc, slot, release
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
