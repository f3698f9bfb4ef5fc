"""Native frames of a rank, from outside: ``py-spy dump --native`` (the ``native-stacks`` extra:
``pip install "ray-wandb-nodes[native-stacks]"`` on the nodes). faulthandler names the Python
function a rank whose Python cannot run is in; py-spy names the C and C++ frames under it (the
CUDA call, the NCCL wait, the library that holds the GIL).

It is taken only for such a rank (its dump thread gave nothing), after faulthandler's dump, every
rank of a node at once and bounded: py-spy stops the process for the moment it reads the stacks,
through ``ptrace``, which a container may forbid (Kubernetes leaves ``SYS_PTRACE`` out by
default): the rank's file then says why there are none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable

# Every rank of a node, at once, its tries included. One dump of a Ray Train worker with torch's
# CPU build took up to 1.4 s on an idle 2-core machine (py-spy reads the symbols of every library
# the process maps, anew each dump); a GPU node's ranks map gigabytes of CUDA libraries more.
PYSPY_TIMEOUT_S = 8.0
PYSPY_TRIES = 3  # a failed dump is tried again (see native_dumps) ...
PYSPY_RETRY_MIN_S = 1.0  # ... where this much of the bound is left
INSTALL_HINT = 'no native frames: install "ray-wandb-nodes[native-stacks]" (py-spy) on the nodes'


def py_spy() -> str | None:
    """The ``py-spy`` beside this Python (its environment's ``bin``), else on ``PATH``; None: none."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def native_dumps(pids: Iterable[int], timeout_s: float = PYSPY_TIMEOUT_S) -> dict[int, tuple[str, str]]:
    """``pid -> (py-spy's text, "")`` or ``("", why there is none)``, every process at once.

    A dump that fails is tried again while the bound leaves time, :data:`PYSPY_TRIES` in all:
    py-spy reads each thread's native and Python frames one after the other and fails the whole
    dump where it cannot pair them ("Failed to merge native and python frames", py-spy #210 and
    #673), which a thread caught mid-call makes happen now and then and not on the next try."""
    binary = py_spy()
    pids = list(pids)
    if binary is None:
        return {pid: ("", INSTALL_HINT) for pid in pids}
    deadline = time.monotonic() + timeout_s
    out: dict[int, tuple[str, str]] = {}
    tries = dict.fromkeys(pids, 0)
    pending = pids
    while pending:
        for pid in pending:
            tries[pid] += 1
        for pid, result in _dump_round(binary, pending, deadline, timeout_s).items():
            out[pid] = result
        pending = [
            pid for pid in pending
            if not out[pid][0] and out[pid][1] != _timed_out(timeout_s) and tries[pid] < PYSPY_TRIES
            and deadline - time.monotonic() >= PYSPY_RETRY_MIN_S
        ]  # fmt: skip
    return {
        pid: (text, why if not why or tries[pid] == 1 else f"{why} ({tries[pid]} tries)")
        for pid, (text, why) in out.items()
    }


def _timed_out(timeout_s: float) -> str:
    return f"py-spy gave nothing within {timeout_s:.0f} s"


def _dump_round(binary: str, pids: list[int], deadline: float, timeout_s: float) -> dict[int, tuple[str, str]]:
    """One ``py-spy dump --native`` of each of ``pids``, all at once, until ``deadline``."""
    running: dict[int, subprocess.Popen[str]] = {}
    out: dict[int, tuple[str, str]] = {}
    for pid in pids:
        try:
            running[pid] = subprocess.Popen(
                [binary, "dump", "--native", "--pid", str(pid)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as e:
            out[pid] = ("", f"py-spy could not start: {e.strerror or e}")
    for pid, proc in running.items():
        try:
            text, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[pid] = ("", _timed_out(timeout_s))
            continue
        if proc.returncode == 0 and text.strip():
            out[pid] = (text, "")
        else:
            why = (stderr or text).strip().splitlines()
            out[pid] = ("", f"py-spy: {why[-1] if why else f'exit code {proc.returncode}'}")
    return out
