"""The node's side of a failure: what its logger can tell of its ranks' ends from outside them.

- The ranks' own records (``record``), found beside their beacons.
- Which ranks' processes are gone, and since when on this node's monotonic clock: a process
  that died with no record and was not stopped by Ray died without its Python acting (a
  signal: SIGKILL, the kernel's OOM killer, a crash). :class:`DeathWatch` is fed the ranks'
  ``(rank, pid)`` on each of the logger's looks (the beacon slots it reads already) and keeps,
  per process, its last look alive and its first look gone: the window of its death.
- The memory cgroup's count of OOM kills (cgroup v2 ``memory.events``, v1
  ``memory.oom_control``, both ``oom_kill N``), read when the watch begins and on each look: a
  rise between a process's last look alive and its first look gone says the kernel's OOM killer
  killed a process of this container as it died (which one, the kernel's log says, where it can
  be read); a rise since the start, that it did during the run.

Nothing here imports Ray or wandb, and nothing raises: a file that cannot be read is no evidence.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .record import RankRecord, read_records

CGROUP_ROOT = Path("/sys/fs/cgroup")
_OOM_KILL = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)


def cgroup_memory_files(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The files that may hold the OOM-kill count of the process whose ``/proc/<pid>/cgroup``
    reads ``proc_cgroup``, nearest first: its own cgroup's, then the mount's root (inside a
    container the cgroup namespace's root is the container's, and a path read from outside it
    need not exist there)."""
    out: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2 (unified)
            out += [root / rel / "memory.events", root / "memory.events", root / "unified" / rel / "memory.events"]
        elif "memory" in controllers.split(","):  # cgroup v1
            base = root / controllers
            out += [base / rel / "memory.oom_control", base / "memory.oom_control"]
    return list(dict.fromkeys(out))


def parse_oom_kills(text: str) -> int | None:
    """``oom_kill N`` of a ``memory.events`` (v2) or ``memory.oom_control`` (v1) file."""
    m = _OOM_KILL.search(text)
    return int(m.group(1)) if m else None


def oom_kills(pid: int | None = None, root: Path = CGROUP_ROOT) -> int | None:
    """The OOM kills counted by the memory cgroup of ``pid`` (this process by default), or None
    where no cgroup file says (no memory controller, a kernel before 4.13, no permission)."""
    try:
        proc = Path(f"/proc/{pid if pid is not None else 'self'}/cgroup").read_text()
    except OSError:
        return None
    for path in cgroup_memory_files(proc, root):
        try:
            count = parse_oom_kills(path.read_text())
        except OSError:
            continue
        if count is not None:
            return count
    return None


class OomCounter:
    """:func:`oom_kills` of this process's cgroup, its file found once and then only read."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self._root = root
        self._path: Path | None = None

    def __call__(self) -> int | None:
        if self._path is not None:
            try:
                return parse_oom_kills(self._path.read_text())
            except OSError:
                self._path = None
        try:
            proc = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
        for path in cgroup_memory_files(proc, self._root):
            try:
                count = parse_oom_kills(path.read_text())
            except OSError:
                continue
            if count is not None:
                self._path = path
                return count
        return None


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie not yet reaped): one read of its
    ``/proc/<pid>/stat``, or a signal 0 where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError as e:
            return e.errno == errno.ESRCH
        return False
    state = stat.rsplit(b")", 1)[-1].split()
    return bool(state) and state[0] in (b"Z", b"X")


@dataclass(frozen=True)
class Gone:
    """A rank's process found gone, on this node's monotonic clock."""

    rank: int
    pid: int
    alive_ns: int  # the last look that found it alive (0: never seen alive)
    gone_ns: int  # the first look that found it gone
    oom_kills: int | None = None  # OOM kills the node's cgroup counted between those two looks (None: unknown)


class DeathWatch:
    """The node logger's watch on its ranks' processes. Owned by one thread (the logger's): it is
    fed on each look and answers from what it saw, with no clock of its own but the caller's. Each
    look reads the cgroup's OOM-kill count once, so a death comes with the kills counted as it
    happened (between its last look alive and its first look gone)."""

    def __init__(self, read_oom_kills: Callable[[], int | None] | None = None) -> None:
        self._read = read_oom_kills or OomCounter()
        self._baseline = self._read()  # the count when the watch began (the run's start on this node)
        self._alive: dict[tuple[int, int], tuple[int, int | None]] = {}  # (rank, pid) -> last look alive, its count
        self._gone: dict[tuple[int, int], Gone] = {}

    def look(self, ranks: Iterable[tuple[int, int]], now_ns: int | None = None) -> list[Gone]:
        """Look at the ``(rank, pid)`` processes now; the ones newly found gone."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        watched = [key for key in ranks if key not in self._gone]
        count = self._read() if watched else None
        new = []
        for key in watched:
            if process_gone(key[1]):
                alive_ns, before = self._alive.get(key, (0, None))
                kills = count - before if count is not None and before is not None else None
                gone = Gone(key[0], key[1], alive_ns, now, kills)
                self._gone[key] = gone
                new.append(gone)
            else:
                self._alive[key] = (now, count)
        return new

    def gone(self) -> list[Gone]:
        return sorted(self._gone.values(), key=lambda g: (g.rank, g.gone_ns))

    def oom_kills_since_start(self) -> int | None:
        """The OOM kills the cgroup counted since the watch began; None where it cannot tell."""
        count = self._read()
        return count - self._baseline if count is not None and self._baseline is not None else None


@dataclass(frozen=True)
class NodeFacts:
    """What one node tells of its ranks' ends when asked (crosses from the node to the driver)."""

    records: tuple[RankRecord, ...]  # the ranks' own records (raised, stopped)
    gone: tuple[Gone, ...]  # the ranks' processes found gone
    oom_kills: int | None  # OOM kills the node's cgroup counted since the run started there; None: unknown
    memory_percent: float | None = None  # the node's last memory sample


def node_facts(
    directory: Path, watch: DeathWatch, ranks: Iterable[tuple[int, int]], memory_percent: float | None = None
) -> NodeFacts:
    """The node's facts now: its ranks' records in ``directory``, a last look at their processes
    and the OOM kills counted since the watch began."""
    watch.look(ranks)
    return NodeFacts(tuple(read_records(directory)), tuple(watch.gone()), watch.oom_kills_since_start(), memory_percent)
