"""``ConsoleTailer``: the node logger's thread that brings its ranks' console into the run.

It follows the stdout and stderr files Ray keeps for each rank of this node (found by the rank's
process id, see ``follow``), splits them into lines (``lines``), keeps to the run's budget
(``budget``), masks the secrets in them (``mask``: before any line leaves the node) and hands each
poll's lines to a sink (``sender.RunConsole`` writes them into the run). Nothing runs in the rank's
process: the cost is this thread's, on the logger's node.

The thread owns every piece of its state; the logger's other threads send it commands
(:class:`Watch`, :class:`EndAttempt`, :class:`Finish`) and never touch it. Its cost is bounded
whatever the ranks print: it reads at most ``READ_RATE`` bytes a second of all files, holds at most
one open line a stream (``lines.MAX_LINE_BYTES``), one ring of last lines a rank
(``budget.TAIL_MAX``) and a few hundred remembered lines for echoes (``rank.ECHO_LINES``).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._mask import mask
from .._warn import Warner, describe
from .budget import ConsolePlan, RankBudget, attempt_share
from .follow import READ_BYTES, FileFollower, worker_files
from .lines import PROGRESS_EVERY_S, ConsoleLine, Kind, Stream
from .rank import RankConsole

POLL_S = 0.5
# Bytes a second the node reads of all its ranks' files together (~20,000 lines of 100 bytes): the
# bound on the thread's CPU (bench/console_cost.py: ~4 % of a core a MiB a second on 2 loaded
# cores). A rank that writes faster falls behind and, past follow.MAX_BACKLOG, is skipped ahead.
READ_RATE = 2 << 20
SEND_LINES = 2_000  # lines held before they go to the sink, within a poll or a drain
FIND_S = 30.0  # a rank's files looked for at every poll this long, then every FIND_LATER_S
FIND_LATER_S = 10.0
# How long an attempt's end waits for a rank's process that is still alive (Ray ends the workers
# as it ends the attempt) before it reads its files to their ends anyway.
END_WAIT_S = 2.0
Sink = Callable[[Sequence[ConsoleLine]], None]


def _ERR_FIRST(item: tuple[Stream, FileFollower]) -> int:  # noqa: N802 - a sort key, named as a constant
    return 0 if item[0] is Stream.ERR else 1


@dataclass(frozen=True)
class RankProcess:
    """A rank of this node's current attempt and its process (the train worker actor's)."""

    rank: int
    pid: int


@dataclass(frozen=True)
class Watch:
    """The ranks of this node's current attempt; ranks watched before and not here end (failed).
    ``plan``: the run's budget anew (the worker group changed size); what was sent counts still."""

    ranks: tuple[RankProcess, ...]
    plan: ConsolePlan | None = None


@dataclass(frozen=True)
class EndAttempt:
    """The attempt ended (its ranks' processes are gone or going): ``failed`` sends every rank's
    last lines, else only those of ranks whose live share ran out. ``dead``: (rank, lines) of
    the failure's dead ranks, first named first, each with its lines from the run's pool
    (``budget.dead_allowance``): theirs go first (see ``budget``)."""

    failed: bool
    dead: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Finish:
    """The run ends: the attempt ends as :class:`EndAttempt` says, every line is handed to the sink,
    then the thread stops and sets ``done``."""

    failed: bool
    done: threading.Event = field(default_factory=threading.Event, compare=False)


Command = Watch | EndAttempt | Finish


def _proc_start(pid: int) -> int | None:
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


def _masked(line: ConsoleLine) -> ConsoleLine:
    """``line`` with its secrets masked (the plugin's own notes hold none)."""
    if line.kind is Kind.NOTE:
        return line
    text = mask(line.text)
    return line if text is line.text else line._replace(text=text)


_WORKER_FILE = re.compile(r"^worker-[0-9a-f]+-(?:[0-9a-f]+-)?(\d+)\.(?:out|err)$")


def _pids_with_files(logs_dir: Path) -> set[int]:
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


class _Watched:
    """A watched rank: its console, its files, its process."""

    def __init__(self, rp: RankProcess, console: RankConsole, now: float) -> None:
        self.rp = rp
        self.console = console
        self.files: dict[Stream, FileFollower] = {}
        self.started = _proc_start(rp.pid)
        self.since = now
        self.looked_at = float("-inf")
        self.ended = False  # its process is gone and its files were read to the end

    def alive(self) -> bool:
        return self.started is not None and _proc_start(self.rp.pid) == self.started


class ConsoleTailer:
    """Follows this node's ranks' console files and hands their lines to ``sink``.

    ``logs_dir`` is the node's Ray session ``logs`` folder. ``from_end``: a logger that restarted
    reads the files of ranks whose process is older than its own from their ends, its earlier
    self having sent what came before (a rank started since is read from its start).
    """

    def __init__(
        self,
        plan: ConsolePlan,
        logs_dir: str | os.PathLike[str],
        sink: Sink,
        *,
        warner: Warner | None = None,
        poll_s: float = POLL_S,
        read_rate: int = READ_RATE,
        progress_every_s: float = PROGRESS_EVERY_S,
        from_end: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self._logs = Path(logs_dir)
        self._sink = sink
        self._warner = warner or Warner()
        self._poll_s = poll_s
        self._read_rate = read_rate
        self._every = progress_every_s
        self._from_end = _proc_start(os.getpid()) if from_end else None  # this process's start
        self._clock = clock
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._finishing: Finish | None = None  # the finish asked (by the first caller)
        # The thread's own state.
        self._watched: dict[int, _Watched] = {}
        self._budgets: dict[int, RankBudget] = {}
        self._tails_left = plan.node_tails
        self.sent = 0  # lines handed to the sink (read by tests and benchmarks after finish)

    # -- commands, from any thread --------------------------------------------------------------

    def start(self) -> ConsoleTailer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rwn-console", daemon=True)
            self._thread.start()
        return self

    def watch(self, ranks: Sequence[RankProcess], plan: ConsolePlan | None = None) -> None:
        self._commands.put(Watch(tuple(ranks), plan))

    def end_attempt(self, failed: bool, dead: Sequence[tuple[int, int]] = ()) -> None:
        self._commands.put(EndAttempt(failed, tuple(dead)))

    def finish(self, failed: bool, timeout: float) -> bool:
        """End the run's console within ``timeout`` s; whether every line reached the sink in time."""
        self.request_finish(failed)
        return self.wait_finished(timeout)

    def request_finish(self, failed: bool) -> None:
        """End the run's console (see :class:`Finish`) without waiting; the first call counts."""
        if self._finishing is None:
            self._finishing = Finish(failed)
            self._commands.put(self._finishing)

    def wait_finished(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) for the finish asked; whether every line reached the sink."""
        if self._finishing is None:
            return False
        if self._thread is None or not self._thread.is_alive():  # never started, or finished before
            return True
        return self._finishing.done.wait(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                command: Command | None = self._commands.get(timeout=self._poll_s)
            except queue.Empty:
                command = None
            while command is not None:
                if self._handle(command):
                    return
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            self._guarded(self._poll)

    def _handle(self, command: Command) -> bool:
        """Apply ``command``; True when the thread is to stop."""
        if isinstance(command, Watch):
            self._guarded(lambda: self._watch(command.ranks, command.plan))
        elif isinstance(command, EndAttempt):
            self._guarded(lambda: self._end(command.failed, dict(command.dead)))
        else:
            self._guarded(lambda: self._end(command.failed, {}))
            command.done.set()
            return True
        return False

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the ranks' console must never fail the logger
            self._warner.warn(f"console:{type(e).__name__}", f"the ranks' console lines stopped a step ({describe(e)})")

    def _watch(self, ranks: tuple[RankProcess, ...], plan: ConsolePlan | None) -> None:
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
                self._watched[rp.rank] = _Watched(rp, RankConsole(rp.rank, budget, self._every), now)
        self._poll()

    def _end(self, failed: bool, dead: dict[int, int]) -> None:
        # Ranks whose process ended before their attempt did died of their own (Ray ends the rest).
        early = {rank for rank, w in self._watched.items() if w.ended or (w.files and not w.alive())}
        deadline = time.monotonic() + END_WAIT_S
        while time.monotonic() < deadline and any(
            not w.ended and w.files and w.alive() for w in self._watched.values()
        ):
            self._poll()
            time.sleep(0.05)
        self._poll()  # ranks that ended since the last poll: drained there
        named = {rank: i for i, rank in enumerate(dead)}  # the first named first
        ordered = sorted(
            self._watched.values(),
            key=lambda w: (0, named[w.rp.rank]) if w.rp.rank in named else (1 if w.rp.rank in early else 2, w.rp.rank),
        )
        self._send(self._finish(ordered, failed, dead, self._clock()))
        self._watched.clear()

    def _finish(self, ranks: Sequence[_Watched], failed: bool, dead: dict[int, int], now: float) -> list[ConsoleLine]:
        """End ``ranks`` in this order: what is left of their files, then their last lines (when
        wanted: see ``RankConsole.end``), each dead rank's ``dead`` lines first, then from this
        attempt's share of the node's last lines (``budget.attempt_share``) while it lasts."""
        share = attempt_share(self._tails_left)
        lines: list[ConsoleLine] = []
        for watched in ranks:
            if not watched.ended:
                lines += self._drain(watched, now)
            allowed = dead.get(watched.rp.rank, 0)
            end = watched.console.end(failed, allowed + share)
            taken = max(sum(1 for line in end if line.kind is not Kind.NOTE) - allowed, 0)
            share -= taken
            self._tails_left -= taken
            lines += end
        return lines

    def _poll(self) -> None:
        now = self._clock()
        self._find(now)
        reading = sum(1 for w in self._watched.values() if w.files and not w.ended)
        share = max(READ_BYTES, int(self._read_rate * self._poll_s) // max(reading, 1))
        lines: list[ConsoleLine] = []
        for watched in self._watched.values():
            if watched.ended:
                continue
            if watched.files and not watched.alive():
                lines += self._drain(watched, now)  # its process is gone: nothing more comes
                continue
            lines += self._read(watched, now, share)
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
        have = _pids_with_files(self._logs)
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

    def _older(self, watched: _Watched) -> bool:
        """Whether the rank's process started before this (restarted) logger's: read from the end."""
        mine = self._from_end
        return mine is not None and watched.started is not None and watched.started < mine

    def _read(self, watched: _Watched, now: float, limit: int | None) -> list[ConsoleLine]:
        """What the rank's files grew by, at most ``limit`` bytes of the two (None: to their ends),
        in turns of one read a stream, stderr first, so that the two copies of a print are read
        close together (see ``rank.EchoFilter``). What is not read now is read at the next poll,
        or skipped once a file is far behind (``follow.MAX_BACKLOG``)."""
        lines: list[ConsoleLine] = []
        left = limit
        turn = sorted(watched.files.items(), key=_ERR_FIRST)
        while turn and (left is None or left > 0):
            for stream, follower in list(turn):
                chunk = follower.read(READ_BYTES if left is None else max(min(READ_BYTES, left), 1))
                if chunk.skipped:
                    lines += watched.console.skipped(stream, chunk.skipped, now)
                if chunk.data:
                    lines += watched.console.feed(stream, chunk.data, now)
                    if left is not None:
                        left -= len(chunk.data)
                else:
                    turn.remove((stream, follower))
            if len(lines) >= SEND_LINES:  # a long drain holds a batch at a time, never the files
                self._send(lines)
                lines = []
        return lines

    def _drain(self, watched: _Watched, now: float) -> list[ConsoleLine]:
        """Read the rank's files to their ends, end its open lines and close them."""
        lines = self._read(watched, now, None)
        for stream, follower in sorted(watched.files.items(), key=_ERR_FIRST):
            lines += watched.console.close(stream, now)
            follower.close()
        watched.ended = True
        return lines

    def _send(self, lines: list[ConsoleLine]) -> None:
        """Hand ``lines`` to the sink, each rank's text masked first (``mask``): every line that
        leaves the node, live or last, goes through here."""
        if not lines:
            return
        lines = [_masked(line) for line in lines]
        try:
            self._sink(lines)
            self.sent += len(lines)
        except Exception as e:  # noqa: BLE001 - a failing sink loses lines, never the logger
            self._warner.warn(f"console:sink:{type(e).__name__}", f"ranks' console lines were not sent ({describe(e)})")
