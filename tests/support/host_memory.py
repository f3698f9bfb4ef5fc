"""The memory cgroups of the test hosts (``tests/support/hosts.py``): one per host that has a memory
limit, made under this process's own memory cgroup (so a sandbox's limit still holds above it),
named ``rwnh<slot>-<host>`` as the rest of the slot, and removed on stop or by the sweep of what a
crashed run left.

cgroup v1 where the memory controller is mounted as v1 (``/sys/fs/cgroup/memory``, as on this
machine), else cgroup v2 (``/sys/fs/cgroup`` with ``memory`` among its controllers): found at run
time from ``/proc/self/cgroup``. v2 lets a cgroup with processes of its own give its children no
controller: where this process's cgroup cannot, :func:`memory_limits_unsupported` says why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "rwnh"


def _own() -> tuple[Path, int] | None:
    """This process's memory cgroup directory and its version (1 or 2), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # v1 first: where both are mounted, v1 holds the memory controller
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = ROOT / controllers / path.lstrip("/")
            return (folder, 1) if (folder / "memory.limit_in_bytes").exists() else None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and "memory" in _read(ROOT / "cgroup.controllers").split():
            return ROOT / path.lstrip("/"), 2
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def memory_limits_unsupported() -> str | None:
    """Why hosts cannot have memory limits here, or None when they can."""
    own = _own()
    if own is None:
        return "no memory cgroup controller is mounted (cgroup v1 memory or v2 with memory)"
    folder, version = own
    if version == 2 and "memory" not in _read(folder / "cgroup.subtree_control").split():
        try:
            (folder / "cgroup.subtree_control").write_text("+memory")
        except OSError as e:
            return f"cgroup v2: {folder} cannot give its children the memory controller ({e})"
    return None


def version() -> int:
    own = _own()
    if own is None:
        raise RuntimeError(memory_limits_unsupported() or "no memory cgroup")
    return own[1]


def create(slot: int, host: str, limit_bytes: int) -> Path:
    """The host's memory cgroup with ``limit_bytes`` (no swap beyond it), made or reset."""
    reason = memory_limits_unsupported()
    own = _own()
    if reason or own is None:
        raise RuntimeError(reason)
    folder = own[0] / f"{PREFIX}{slot}-{host}"
    folder.mkdir(exist_ok=True)
    if own[1] == 1:
        (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
        with contextlib.suppress(OSError):  # no swap accounting: nothing to bound
            (folder / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
    else:
        (folder / "memory.max").write_text(str(limit_bytes))
        with contextlib.suppress(OSError):
            (folder / "memory.swap.max").write_text("0")
    return folder


def sweep(slot: int) -> None:
    """Remove the slot's memory cgroups: their processes killed (waited for, up to 10 s), then the
    directories (a cgroup goes once it holds no process)."""
    own = _own()
    if own is None:
        return
    for folder in own[0].glob(f"{PREFIX}{slot}-*"):
        if not folder.is_dir():
            continue
        deadline = time.monotonic() + 10
        while True:
            pids = [int(p) for p in _read(folder / "cgroup.procs").split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                folder.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break  # left for the next sweep
                time.sleep(0.05)
