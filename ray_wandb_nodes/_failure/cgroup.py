"""A process's memory cgroup, as its node reads it from outside: found from ``/proc/<pid>/cgroup``
while the process lives (after its death ``/proc/<pid>`` is gone), then read for its count of OOM
kills and its figures, the process dead or alive (the cgroup outlives it while others are in it:
a container's, a pod's).

- cgroup v1: ``memory.oom_control`` (``oom_kill N``, kernel >= 4.13), ``memory.limit_in_bytes``,
  ``memory.usage_in_bytes``, ``memory.max_usage_in_bytes`` (the peak);
- cgroup v2: ``memory.events`` (``oom_kill N``), ``memory.max``, ``memory.current``,
  ``memory.peak`` (kernel >= 5.19).

The limit that binds may be an ancestor's (a pod's limit above its container's cgroup): the
figures are the tightest limit from the cgroup up to its mount's root, with that cgroup's usage and
peak. v2 counts an OOM kill in the victim's cgroup and every ancestor; v1 in the victim's cgroup
only: either way, the killed process's own cgroup counts it.

Nothing here raises: a file that cannot be read is no evidence.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
GIB = 1024**3
_UNLIMITED = 1 << 60  # v1 writes "no limit" as 2^63 rounded down to a page
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's figures, in bytes (None: not known)."""

    limit: int | None = None  # the tightest limit from the cgroup up (None: none)
    usage: int | None = None  # the limited cgroup's usage when read
    peak: int | None = None  # its peak usage (v1 max_usage_in_bytes; v2 memory.peak, kernel >= 5.19)
    version: int = 1


def parse_oom_kills(text: str) -> int | None:
    """``oom_kill N`` of a ``memory.events`` (v2) or ``memory.oom_control`` (v1) file."""
    m = _OOM_KILL.search(text)
    return int(m.group(1)) if m else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None  # v2's "max": no limit
    value = int(text)
    return value if value < _UNLIMITED else None


@dataclass(frozen=True)
class Cgroup:
    """A memory cgroup's directory (``path``) under its mount's root (``top``)."""

    path: Path
    top: Path
    v2: bool

    @property
    def oom_file(self) -> Path:
        return self.path / ("memory.events" if self.v2 else "memory.oom_control")

    def oom_kills(self) -> int | None:
        """The OOM kills this cgroup counted (None: not readable, or a kernel that does not count)."""
        try:
            return parse_oom_kills(self.oom_file.read_text())
        except OSError:
            return None

    def figures(self) -> CgroupMemory:
        """The tightest limit from here up, with that cgroup's usage and peak."""
        names = ("memory.max", "memory.current", "memory.peak") if self.v2 else (
            "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes")  # fmt: skip
        best: tuple[int, Path] | None = None
        level = self.path
        while True:
            limit = _read_int(level / names[0])
            if limit is not None and (best is None or limit < best[0]):
                best = (limit, level)
            if level == self.top or not level.is_relative_to(self.top) or level.parent == level:
                break
            level = level.parent
        where = best[1] if best else self.path
        return CgroupMemory(best[0] if best else None, _read_int(where / names[1]), _read_int(where / names[2]),
                            2 if self.v2 else 1)  # fmt: skip


def candidates(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Cgroup]:
    """Where the memory cgroup of a process whose ``/proc/<pid>/cgroup`` reads ``proc_cgroup`` may
    be, nearest first: v1's memory hierarchy (which holds the memory controller where both are
    mounted), then v2's (``root`` or ``root/unified``); each path as read, then the mount's root
    (inside a container without a cgroup namespace the path read is the machine's, and only the
    root, the container's own, is there)."""
    v1: list[Cgroup] = []
    v2: list[Cgroup] = []
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.strip().lstrip("/")
        if controllers == "":
            for top in (root, root / "unified"):
                v2 += [Cgroup(top / rel, top, True), Cgroup(top, top, True)]
        elif "memory" in controllers.split(","):
            top = root / controllers
            v1 += [Cgroup(top / rel, top, False), Cgroup(top, top, False)]
    return list(dict.fromkeys(v1 + v2))


def find_cgroup(pid: int | None = None, root: Path = CGROUP_ROOT, proc: Path = PROC) -> Cgroup | None:
    """The memory cgroup of ``pid`` (this process by default) whose OOM-kill count can be read;
    None where none can (no memory controller, a kernel before 4.13, no permission)."""
    try:
        text = (proc / (str(pid) if pid is not None else "self") / "cgroup").read_text()
    except OSError:
        return None
    return next((c for c in candidates(text, root) if c.oom_kills() is not None), None)


def rss_bytes(pid: int, proc: Path = PROC) -> int | None:
    """The resident memory of ``pid`` now (``/proc/<pid>/statm``: one small read), or None."""
    try:
        fields = (proc / str(pid) / "statm").read_bytes().split()
        return int(fields[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def gib(value: int) -> str:
    """``3.0 GiB``."""
    return f"{value / GIB:.1f} GiB"
