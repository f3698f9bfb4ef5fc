"""This node's watched ranks, as the console thread keeps them: their files found, read at each
poll within the node's read rate, and ended in order at an attempt's end with their last lines
within the run's budget. Every call comes from the one console thread (``tailer``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .._warn import Warner
from .budget import ConsolePlan, RankBudget, attempt_share
from .commands import RankProcess
from .follow import READ_BYTES, FileFollower, worker_files
from .lines import ConsoleLine, Kind
from .rank import RankConsole
from .watched import SEND_LINES, WatchedRank, pids_with_files, proc_start

FIND_S = 30.0  # a rank's files looked for at every poll this long, then every FIND_LATER_S
FIND_LATER_S = 10.0
# How long an attempt's end waits for a rank's process that is still alive (Ray ends the workers
# as it ends the attempt) before it reads its files to their ends anyway.
END_WAIT_S = 2.0


class NodeRanks:
    """The ranks this node follows: which are watched, their budgets, the node's last lines left.

    ``send`` hands lines out of the node (masked: ``masked_sink``); ``read_bytes``: how many bytes
    of all the files one poll reads; ``from_end``: this (restarted) logger's process start, whose
    older ranks are read from their files' ends.
    """

    def __init__(
        self,
        plan: ConsolePlan,
        logs: Path,
        send: Callable[[list[ConsoleLine]], None],
        warner: Warner,
        *,
        read_bytes: int,
        progress_every_s: float,
        from_end: int | None,
        clock: Callable[[], float],
    ) -> None:
        self.plan = plan
        self._logs = logs
        self._send = send
        self._warner = warner
        self._read_bytes = read_bytes
        self._every = progress_every_s
        self._from_end = from_end
        self._clock = clock
        self._watched: dict[int, WatchedRank] = {}
        self._budgets: dict[int, RankBudget] = {}
        self._tails_left = plan.node_tails

    def watch(self, ranks: tuple[RankProcess, ...], plan: ConsolePlan | None) -> None:
        if plan is not None and plan != self.plan:
            sent = self.plan.node_tails - self._tails_left
            self.plan, self._tails_left = plan, max(plan.node_tails - sent, 0)
            for rank, budget in self._budgets.items():
                budget.replan(plan.live(rank))
        if not self.plan.on:
            return
        now = self._clock()
        keep = {rp.rank: rp for rp in ranks}
        gone = [w for rank, w in self._watched.items() if keep.get(rank) != w.rp]
        if gone:  # gone from the attempt, or a new process of the rank: ended with a failure
            self._send(self._finish(gone, failed=True, dead={}, now=now))
            for watched in gone:
                del self._watched[watched.rp.rank]
        for rp in ranks:
            if rp.rank not in self._watched:
                budget = self._budgets.setdefault(rp.rank, RankBudget(self.plan.live(rp.rank), self.plan.tail))
                self._watched[rp.rank] = WatchedRank(rp, RankConsole(rp.rank, budget, self._every), now)
        self.poll()

    def end(self, failed: bool, dead: dict[int, int]) -> None:
        # Ranks whose process ended before their attempt did died of their own (Ray ends the rest).
        early = {rank for rank, w in self._watched.items() if w.ended or (w.files and not w.alive())}
        deadline = time.monotonic() + END_WAIT_S
        while time.monotonic() < deadline and any(
            not w.ended and w.files and w.alive() for w in self._watched.values()
        ):
            self.poll()
            time.sleep(0.05)
        self.poll()  # ranks that ended since the last poll: drained there
        named = {rank: i for i, rank in enumerate(dead)}  # the first named first
        ordered = sorted(
            self._watched.values(),
            key=lambda w: (0, named[w.rp.rank]) if w.rp.rank in named else (1 if w.rp.rank in early else 2, w.rp.rank),
        )
        self._send(self._finish(ordered, failed, dead, self._clock()))
        self._watched.clear()

    def _finish(
        self, ranks: Sequence[WatchedRank], failed: bool, dead: dict[int, int], now: float
    ) -> list[ConsoleLine]:
        """End ``ranks`` in this order: what is left of their files, then their last lines (when
        wanted: see ``RankConsole.end``), each dead rank's ``dead`` lines first, then from this
        attempt's share of the node's last lines (``budget.attempt_share``) while it lasts."""
        share = attempt_share(self._tails_left)
        lines: list[ConsoleLine] = []
        for watched in ranks:
            if not watched.ended:
                lines += watched.drain(now, self._send)
            allowed = dead.get(watched.rp.rank, 0)
            end = watched.console.end(failed, allowed + share)
            taken = max(sum(1 for line in end if line.kind is not Kind.NOTE) - allowed, 0)
            share -= taken
            self._tails_left -= taken
            lines += end
        return lines

    def poll(self) -> None:
        now = self._clock()
        self._find(now)
        reading = sum(1 for w in self._watched.values() if w.files and not w.ended)
        share = max(READ_BYTES, self._read_bytes // max(reading, 1))
        lines: list[ConsoleLine] = []
        for watched in self._watched.values():
            if watched.ended:
                continue
            if watched.files and not watched.alive():
                lines += watched.drain(now, self._send)  # its process is gone: nothing more comes
                continue
            lines += watched.read(now, share, self._send)
            lines += watched.console.tick(now)
            if len(lines) >= SEND_LINES:
                self._send(lines)
                lines = []
        self._send(lines)

    def _find(self, now: float) -> None:
        """Look for the files of ranks that have none yet (one listing for all of them)."""
        wanted = [
            w
            for w in self._watched.values()
            if not w.ended and len(w.files) < 2 and now - w.looked_at >= (0 if now - w.since < FIND_S else FIND_LATER_S)
        ]
        if not wanted:
            return
        have = pids_with_files(self._logs)
        for w in wanted:
            w.looked_at = now
            if w.rp.pid in have:
                for stream, path in worker_files(self._logs, w.rp.pid).items():
                    if stream not in w.files:
                        w.files[stream] = FileFollower(path, from_end=self._older(w))
            if len(w.files) < 2 and now - w.since >= FIND_S:
                self._warner.warn(
                    f"console:files:{w.rp.rank}",
                    f"rank {w.rp.rank}'s output files (pid {w.rp.pid}) are not in {self._logs} after {FIND_S:.0f}s: "
                    "its console is not in the run (RAY_LOG_TO_STDERR=1 keeps it out of files)",
                )

    def _older(self, watched: WatchedRank) -> bool:
        """Whether the rank's process started before this (restarted) logger's: read from the end."""
        mine = self._from_end
        return mine is not None and watched.started is not None and watched.started < mine


def this_process_start() -> int | None:
    """This process's start (what a restarted logger's ``from_end`` compares ranks by)."""
    return proc_start(os.getpid())
