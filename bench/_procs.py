"""Process trees from /proc (Linux): resident memory, proportional memory and CPU time."""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(entry)] = (ppid, cmd)
    return table


def tree(root: int, table: dict[int, tuple[int, str]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(p for p, (ppid, _) in table.items() if ppid == pid)
    return out


def rss_mib(pid: int | str) -> float:
    """The resident memory of process ``pid`` (``"self"``: this one) in MiB."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def cpu_seconds(pid: int | str) -> float:
    """The CPU time, user and system, of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def usage(pid: int) -> tuple[float, float, float]:
    """(RSS MiB, PSS MiB, CPU seconds) of one process; zeros when it is gone."""
    try:
        rss, cpu = rss_mib(pid), cpu_seconds(pid)
        pss = 0.0
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
                    break
    except OSError:
        return 0.0, 0.0, 0.0
    return rss, pss, cpu


def short(cmd: str) -> str:
    head = cmd.split()[0] if cmd.split() else "?"
    return "ray::NodeLogger" if cmd.startswith("ray::NodeLogger") else os.path.basename(head)


class TreeSampler(threading.Thread):
    """Samples, once a second, the process tree of every process whose command starts with ``prefix``."""

    def __init__(self, prefix: str, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.prefix = prefix
        self.interval_s = interval_s
        # root pid -> [(monotonic time, {process name: (rss, pss, cpu)})]
        self.samples: dict[int, list[tuple[float, dict[str, tuple[float, float, float]]]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            table = proc_table()
            for pid, (_, cmd) in table.items():
                if not cmd.startswith(self.prefix):
                    continue
                parts: dict[str, tuple[float, float, float]] = {}
                for p in tree(pid, table):
                    name = short(table.get(p, (0, "?"))[1])
                    rss, pss, cpu = usage(p)
                    old = parts.get(name, (0.0, 0.0, 0.0))
                    parts[name] = (old[0] + rss, old[1] + pss, old[2] + cpu)
                self.samples.setdefault(pid, []).append((time.monotonic(), parts))
