"""The ranks' console in a node logger: one :class:`~ray_wandb_nodes._console.ConsoleTailer` a run
this logger writes for, following the run's ranks on this node (:class:`~.wire.ConsoleRanks`) in
the files Ray writes for their processes, and writing their lines through the run's node writer
(``_console.RunConsole``: ``Run.write_logs``, the writer's console capture staying off).

The tailer starts once the run's writer has joined (its lines need a run to go to); ranks told
before that wait for the join. Its thread owns what it reads; the logger's threads only send it
commands: the ranks (a writer call, in order after the writer's join), an attempt's end (a
control call, answered while a writer call runs) and the run's finish, before its writer's own
(a writer call, bounded), which hands every rank's last lines to the run first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .. import _ray
from .._console import ConsoleTailer, RunConsole, log_tail
from .._failure import LAST_WORDS_MARKERS as MARKERS
from .._warn import Warner
from .wire import ConsoleEnd, ConsoleRanks

# The longest a writer's finish waits for its ranks' last lines (the tailer waits up to 2 s for a
# rank's process still being ended, then reads the files to their ends); the driver side bounds
# the whole finish anyway.
FINISH_S = 15.0


SEARCH_BYTES = 4 << 20  # of each of a dead worker's files, where its tail holds no last words
MAX_SAID = 40  # lines from further back


def ray_logs(logs_dir: Callable[[], str | None] | None, warner: Warner, node: str) -> str | None:
    """The Ray log folder the ranks' console is read from (``logs_dir``, else this node's own);
    None, with one warning naming ``node``, where Ray writes none."""
    logs = (logs_dir or _ray.logs_dir)()
    if logs is None:
        warner.warn(
            "console:no-logs",
            f"{node} has no Ray log folder (RAY_LOG_TO_STDERR=1 writes no files): its ranks' console is not in the run",
        )
    return logs


def last_words(pid: int) -> str:
    """The tail of worker ``pid``'s log files on this node ("" where there are none): what a rank
    that died without a record printed last (``_failure.NodeDeaths`` reads it once, as it finds
    the process gone)."""
    logs = _ray.logs_dir()
    if not logs:
        return ""
    tail = log_tail(logs, pid)
    if MARKERS.search(tail):
        return tail
    # Nothing in the tail says how it ended: what printed after (a crash dump's thousands of lines,
    # every thread's stack) may have pushed NCCL's or CPython's lines out of it. The lines that say
    # so, from further back (a bounded read, once a death).
    earlier = log_tail(logs, pid, SEARCH_BYTES)
    said = [line for line in earlier.splitlines() if MARKERS.search(line)]
    return "\n".join([*said[-MAX_SAID:], tail])


class NodeConsoles:
    """The tailers of one logger, by run id. ``writing``: the lock of the logger's writes into a
    run (wandb's run is used by one thread at a time); ``from_end``: a restarted logger starts at
    the files' ends, its earlier process having sent what came before."""

    def __init__(
        self,
        warner: Warner,
        writing: threading.Lock,
        *,
        from_end: bool = False,
        logs_dir: Callable[[], str | None] | None = None,
    ) -> None:
        self._warner = warner
        self._writing = writing
        self._from_end = from_end
        self._logs_dir = logs_dir  # None: this node's (``_ray.logs_dir``), asked when first needed
        self._lock = threading.Lock()  # the two tables, read and changed by the writer and control threads
        self._tailers: dict[str, ConsoleTailer] = {}
        self._waiting: dict[str, ConsoleRanks] = {}  # ranks of a run whose writer has not joined yet

    def ranks(self, ranks: ConsoleRanks, run: Any | None) -> None:
        """The run's ranks here now; ``run``: its joined writer (None: not yet, kept for its join)."""
        if run is None:
            with self._lock:
                self._waiting[ranks.run_id] = ranks
            return
        tailer = self._tailer(ranks, run)
        if tailer is not None:
            tailer.watch(ranks.ranks, ranks.plan)

    def joined(self, run_id: str, run: Any) -> None:
        """The run's writer joined: the ranks told before follow now."""
        with self._lock:
            waiting = self._waiting.pop(run_id, None)
        if waiting is not None:
            self.ranks(waiting, run)

    def end(self, end: ConsoleEnd) -> None:
        """The run's attempt ended: the tailer sends its ranks' last lines if it failed, the dead
        ranks' first. Never waits."""
        with self._lock:
            tailer = self._tailers.get(end.run_id)
            if tailer is None:  # not followed yet: an end before the join ends nothing there
                self._waiting.pop(end.run_id, None)
        if tailer is not None:
            tailer.end_attempt(end.failed, end.dead)

    def finish(self, run_id: str, failed: bool, timeout: float = FINISH_S) -> bool:
        """The run ends here: every rank's lines to the run (the last lines too when ``failed``), before
        its writer finishes; whether all went within ``timeout``."""
        with self._lock:
            tailer = self._tailers.pop(run_id, None)
            self._waiting.pop(run_id, None)
        if tailer is None:
            return True
        done = tailer.finish(failed, timeout)
        if not done:
            self._warner.warn(
                f"console:finish:{run_id}",
                f"the ranks' last console lines did not all reach the run within {timeout:.0f}s",
            )
        return done

    def _tailer(self, ranks: ConsoleRanks, run: Any) -> ConsoleTailer | None:
        with self._lock:
            tailer = self._tailers.get(ranks.run_id)
        if tailer is not None:
            return tailer
        logs = ray_logs(self._logs_dir, self._warner, "this node")
        if logs is None:
            return None
        sink = RunConsole(run, lock=self._writing)
        tailer = ConsoleTailer(ranks.plan, logs, sink, warner=self._warner, from_end=self._from_end).start()
        with self._lock:
            self._tailers[ranks.run_id] = tailer
        return tailer
