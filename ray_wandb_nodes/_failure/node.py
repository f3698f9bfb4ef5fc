"""The node's side of a failure: what its logger can tell of its ranks' ends from outside them.

- The ranks' own records (``record``), found beside their beacons.
- Which ranks' processes are gone, and since when on this node's monotonic clock: a process
  that died with no record and was not stopped by Ray died without its Python acting (a
  signal: SIGKILL, the kernel's OOM killer, a crash). :class:`DeathWatch` is fed the ranks'
  ``(rank, pid)`` on each of the logger's looks (the beacon slots it reads already) and keeps,
  per process, its last look alive and its first look gone: the window of its death.
- The killed rank's own memory cgroup (``cgroup``: v1 and v2), found from its pid at first
  sight, while ``/proc/<pid>`` is there, and read on each look while it lives: a rise of its
  OOM-kill count between its last look alive and its first look gone says the kernel's OOM
  killer killed a process of its cgroup as it died, with the cgroup's limit and peak. Where its
  cgroup cannot be found, the node's (this process's) count stands in; a rise since the watch
  began says the kernel killed something during the run.
- Each rank's resident memory on each look (``/proc/<pid>/statm``: one small read), its last and
  its peak: the size a killed rank had reached, and which rank grew where Ray's memory monitor
  killed another (it kills the newest worker, not the largest).

Nothing here imports Ray or wandb, and nothing raises: a file that cannot be read is no evidence.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .._hang import RankProgress
from .cgroup import CGROUP_ROOT, PROC, Cgroup, CgroupMemory, candidates, find_cgroup, parse_oom_kills, rss_bytes
from .last_words import LastWords
from .record import RankRecord, read_records

__all__ = ["CgroupMemory", "parse_oom_kills"]


def cgroup_memory_files(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The files that may hold the OOM-kill count of the process whose ``/proc/<pid>/cgroup``
    reads ``proc_cgroup``, nearest first (see ``cgroup.candidates``)."""
    return [c.oom_file for c in candidates(proc_cgroup, root)]


def oom_kills(pid: int | None = None, root: Path = CGROUP_ROOT) -> int | None:
    """The OOM kills counted by the memory cgroup of ``pid`` (this process by default), or None
    where no cgroup file says (no memory controller, a kernel before 4.13, no permission)."""
    cgroup = find_cgroup(pid, root)
    return cgroup.oom_kills() if cgroup is not None else None


class OomCounter:
    """:func:`oom_kills` of this process's cgroup (the node's: a node logger shares its node's
    container), its file found once and then only read."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self._root = root
        self._cgroup: Cgroup | None = None

    def __call__(self) -> int | None:
        if self._cgroup is not None:
            count = self._cgroup.oom_kills()
            if count is not None:
                return count
        self._cgroup = find_cgroup(None, self._root)
        return self._cgroup.oom_kills() if self._cgroup is not None else None


def process_gone(pid: int, proc: Path = PROC) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie not yet reaped): one read of its
    ``/proc/<pid>/stat``, or a signal 0 where there is no ``/proc``."""
    try:
        with open(proc / str(pid) / "stat", "rb") as f:
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
class RankMemory:
    """A rank's resident memory as its node sampled it on its looks (bytes)."""

    rank: int
    pid: int
    first: int  # at its first sample
    last: int  # at its last sample alive
    peak: int  # the largest sample

    def seen(self, rss: int) -> RankMemory:
        return RankMemory(self.rank, self.pid, self.first, rss, max(self.peak, rss))


@dataclass(frozen=True)
class Gone:
    """A rank's process found gone, on this node's monotonic clock."""

    rank: int
    pid: int
    alive_ns: int  # the last look that found it alive (0: never seen alive)
    gone_ns: int  # the first look that found it gone
    oom_kills: int | None = None  # OOM kills counted between those two looks (None: unknown)
    cgroup: CgroupMemory | None = None  # its own memory cgroup's figures when found gone (None: the
    # count above is the node's cgroup's, or unknown)
    rss: int | None = None  # its resident memory at its last look alive (bytes)


class DeathWatch:
    """The node logger's watch on its ranks' processes. Owned by one thread (the logger's): it is
    fed on each look and answers from what it saw, with no clock of its own but the caller's.
    Each look reads, per rank, its process's state and resident memory, and, once per memory
    cgroup, the cgroup's OOM-kill count (before the processes, so that a kill after a process
    was found alive counts on the next look): a death comes with the kills its cgroup counted as
    it happened (between its last look alive and its first look gone)."""

    def __init__(
        self,
        read_oom_kills: Callable[[], int | None] | None = None,
        cgroup_root: Path = CGROUP_ROOT,
        proc: Path = PROC,
    ) -> None:
        self._read = read_oom_kills or OomCounter(cgroup_root)
        self._root, self._proc = cgroup_root, proc
        self._baseline = self._read()  # the node's count when the watch began (the run's start on this node)
        # (rank, pid) -> last look alive, the node's count then, its own cgroup's count then
        self._alive: dict[tuple[int, int], tuple[int, int | None, int | None]] = {}
        self._cgroups: dict[tuple[int, int], Cgroup | None] = {}  # found at first sight, while alive
        self._memory: dict[tuple[int, int], RankMemory] = {}
        self._gone: dict[tuple[int, int], Gone] = {}

    def look(self, ranks: Iterable[tuple[int, int]], now_ns: int | None = None) -> list[Gone]:
        """Look at the ``(rank, pid)`` processes now; the ones newly found gone."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        watched = [key for key in ranks if key not in self._gone]
        count = self._read() if watched else None
        for key in watched:
            if key not in self._cgroups:
                self._cgroups[key] = find_cgroup(key[1], self._root, self._proc)
        counts = {c: c.oom_kills() for c in {self._cgroups[k] for k in watched} if c is not None}
        new = []
        for key in watched:
            cgroup = self._cgroups[key]
            if process_gone(key[1], self._proc):
                gone = self._ended(key, now, count, cgroup)
                self._gone[key] = gone
                new.append(gone)
                continue
            self._alive[key] = (now, count, counts.get(cgroup) if cgroup is not None else None)
            rss = rss_bytes(key[1], self._proc)
            if rss is not None:
                held = self._memory.get(key)
                self._memory[key] = held.seen(rss) if held else RankMemory(key[0], key[1], rss, rss, rss)
        return new

    def _ended(self, key: tuple[int, int], now: int, count: int | None, cgroup: Cgroup | None) -> Gone:
        alive_ns, before, own_before = self._alive.get(key, (0, None, None))
        memory = self._memory.get(key)
        rss = memory.last if memory is not None else None
        if cgroup is not None and own_before is not None:
            own = cgroup.oom_kills()
            if own is not None:
                return Gone(key[0], key[1], alive_ns, now, own - own_before, cgroup.figures(), rss)
        kills = count - before if count is not None and before is not None else None
        return Gone(key[0], key[1], alive_ns, now, kills, None, rss)

    def gone(self) -> list[Gone]:
        return sorted(self._gone.values(), key=lambda g: (g.rank, g.gone_ns))

    def memory(self) -> list[RankMemory]:
        """Each watched process's resident memory as sampled, by rank (the dead ones' last too)."""
        return sorted(self._memory.values(), key=lambda m: (m.rank, m.pid))

    def oom_kills_since_start(self) -> int | None:
        """The OOM kills the node's cgroup counted since the watch began; None where it cannot tell."""
        count = self._read()
        return count - self._baseline if count is not None and self._baseline is not None else None


@dataclass(frozen=True)
class NodeFacts:
    """What one node tells of its ranks' ends when asked (crosses from the node to the driver, by
    pickle: new fields go at the end, with defaults)."""

    records: tuple[RankRecord, ...]  # the ranks' own records (raised, stopped)
    gone: tuple[Gone, ...]  # the ranks' processes found gone
    oom_kills: int | None  # OOM kills the node's cgroup counted since the run started there; None: unknown
    memory_percent: float | None = None  # the node's last memory sample
    progress: tuple[RankProgress, ...] = ()  # each rank's last progress off its beacon, aged to the answer
    last_words: tuple[
        tuple[int, int, LastWords], ...
    ] = ()  # (rank, pid, what its log said) of ranks gone without a record
    ranks_memory: tuple[RankMemory, ...] = ()  # each rank's resident memory as the node sampled it


def node_facts(
    directory: Path, watch: DeathWatch, ranks: Iterable[tuple[int, int]], memory_percent: float | None = None
) -> NodeFacts:
    """The node's facts now: its ranks' records in ``directory``, a last look at their processes
    and the OOM kills counted since the watch began."""
    watch.look(ranks)
    return NodeFacts(tuple(read_records(directory)), tuple(watch.gone()), watch.oom_kills_since_start(),
                     memory_percent, ranks_memory=tuple(watch.memory()))  # fmt: skip
