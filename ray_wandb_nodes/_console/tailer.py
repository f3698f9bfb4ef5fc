"""``ConsoleTailer``: the node logger's thread that brings its ranks' console into the run.

It follows the stdout and stderr files Ray keeps for each rank of this node (found by the rank's
process id, see ``follow``), splits them into lines (``lines``), keeps to the run's budget
(``budget``), masks the secrets in them (``mask``: before any line leaves the node) and hands each
poll's lines to a sink (``sender.RunConsole`` writes them into the run). Nothing runs in the rank's
process: the cost is this thread's, on the logger's node. This module holds the thread and the
order of things; the commands are in ``commands``, the ranks it follows in ``node_ranks`` (one
rank's process and files in ``watched``), the way out of the node in ``masked_sink``.

The thread owns every piece of its state; the logger's other threads send it commands
(:class:`Watch`, :class:`EndAttempt`, :class:`Finish`) and never touch it. Its cost is bounded
whatever the ranks print: it reads at most ``READ_RATE`` bytes a second of all files, holds at most
one open line a stream (``lines.MAX_LINE_BYTES``), one ring of last lines a rank
(``budget.TAIL_MAX``) and a few hundred remembered lines for echoes (``rank.ECHO_LINES``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .._warn import Warner, describe
from .budget import ConsolePlan
from .commands import Command, EndAttempt, Finish, RankProcess, Watch
from .lines import PROGRESS_EVERY_S
from .masked_sink import MaskedSink, Sink
from .node_ranks import NodeRanks, this_process_start

POLL_S = 0.5
# Bytes a second the node reads of all its ranks' files together (~20,000 lines of 100 bytes): the
# bound on the thread's CPU (bench/console_cost.py: ~4 % of a core a MiB a second on 2 loaded
# cores). A rank that writes faster falls behind and, past follow.MAX_BACKLOG, is skipped ahead.
READ_RATE = 2 << 20


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
        self._warner = warner or Warner()
        self._poll_s = poll_s
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._finishing: Finish | None = None  # the finish asked (by the first caller)
        # The thread's own state: the ranks it follows, and the way out of the node.
        self._out = MaskedSink(sink, self._warner)
        self._ranks = NodeRanks(
            plan,
            Path(logs_dir),
            self._out.send,
            self._warner,
            read_bytes=int(read_rate * poll_s),
            progress_every_s=progress_every_s,
            from_end=this_process_start() if from_end else None,
            clock=clock,
        )

    @property
    def plan(self) -> ConsolePlan:
        """The run's console budget as the thread last applied it."""
        return self._ranks.plan

    @property
    def sent(self) -> int:
        """Lines handed to the sink (read by tests and benchmarks after finish)."""
        return self._out.sent

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
            self._guarded(self._ranks.poll)

    def _handle(self, command: Command) -> bool:
        """Apply ``command``; True when the thread is to stop."""
        if isinstance(command, Watch):
            self._guarded(lambda: self._ranks.watch(command.ranks, command.plan))
        elif isinstance(command, EndAttempt):
            self._guarded(lambda: self._ranks.end(command.failed, dict(command.dead)))
        else:
            self._guarded(lambda: self._ranks.end(command.failed, {}))
            command.done.set()
            return True
        return False

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as e:  # noqa: BLE001 - the ranks' console must never fail the logger
            self._warner.warn(f"console:{type(e).__name__}", f"the ranks' console lines stopped a step ({describe(e)})")
