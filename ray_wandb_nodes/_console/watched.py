"""One watched rank on the node: its process (alive, and since when), its two files as they are
found, and reading them into its ``RankConsole`` within a byte limit or to their ends."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from .commands import RankProcess
from .follow import READ_BYTES, FileFollower
from .lines import ConsoleLine, Stream
from .rank import RankConsole

SEND_LINES = 2_000  # lines held before they go to the sink, within a poll or a drain


def _err_first(item: tuple[Stream, FileFollower]) -> int:
    return 0 if item[0] is Stream.ERR else 1


def proc_start(pid: int) -> int | None:
    """The process's start time (``/proc/<pid>/stat`` field 22), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        if not os.path.isdir("/proc"):  # not Linux: whether the pid is used at all
            try:
                os.kill(pid, 0)
                return 0
            except OSError:
                return None
        return None


_WORKER_FILE = re.compile(r"^worker-[0-9a-f]+-(?:[0-9a-f]+-)?(\d+)\.(?:out|err)$")


def pids_with_files(logs_dir: Path) -> set[int]:
    """The pids that have worker files in ``logs_dir`` or its ``old/`` (one listing each)."""
    pids: set[int] = set()
    for folder in (logs_dir, logs_dir / "old"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = _WORKER_FILE.match(name)
            if m:
                pids.add(int(m.group(1)))
    return pids


class WatchedRank:
    """A watched rank: its console, its files, its process."""

    def __init__(self, rp: RankProcess, console: RankConsole, now: float) -> None:
        self.rp = rp
        self.console = console
        self.files: dict[Stream, FileFollower] = {}
        self.started = proc_start(rp.pid)
        self.since = now
        self.looked_at = float("-inf")
        self.ended = False  # its process is gone and its files were read to the end

    def alive(self) -> bool:
        return self.started is not None and proc_start(self.rp.pid) == self.started

    def read(self, now: float, limit: int | None, send: Callable[[list[ConsoleLine]], None]) -> list[ConsoleLine]:
        """What the rank's files grew by, at most ``limit`` bytes of the two (None: to their ends),
        in turns of one read a stream, stderr first, so that the two copies of a print are read
        close together (see ``rank.EchoFilter``). What is not read now is read at the next poll,
        or skipped once a file is far behind (``follow.MAX_BACKLOG``). A long read hands each
        ``SEND_LINES`` to ``send`` as it goes."""
        lines: list[ConsoleLine] = []
        left = limit
        turn = sorted(self.files.items(), key=_err_first)
        while turn and (left is None or left > 0):
            for stream, follower in list(turn):
                chunk = follower.read(READ_BYTES if left is None else max(min(READ_BYTES, left), 1))
                if chunk.skipped:
                    lines += self.console.skipped(stream, chunk.skipped, now)
                if chunk.data:
                    lines += self.console.feed(stream, chunk.data, now)
                    if left is not None:
                        left -= len(chunk.data)
                else:
                    turn.remove((stream, follower))
            if len(lines) >= SEND_LINES:  # a long drain holds a batch at a time, never the files
                send(lines)
                lines = []
        return lines

    def drain(self, now: float, send: Callable[[list[ConsoleLine]], None]) -> list[ConsoleLine]:
        """Read the rank's files to their ends, end its open lines and close them."""
        lines = self.read(now, None, send)
        for stream, follower in sorted(self.files.items(), key=_err_first):
            lines += self.console.close(stream, now)
            follower.close()
        self.ended = True
        return lines
