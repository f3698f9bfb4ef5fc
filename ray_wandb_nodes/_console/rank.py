"""One rank's console: its two streams split into lines, echoes dropped, lines sent or kept (pure).

Ray Train V2 sends a train function's ``print`` to the root logger, whose handler writes it to
stderr; Ray 2.60 also writes it to stdout (``patch_print.redirected_print`` tees when
``sys.stdout`` is not ``sys.__stdout__``, which is always so in a Ray worker). Each print would
be in the run twice: :class:`EchoFilter` keeps the first of a line written to both streams. The
tailer reads stderr first, so that copy is the one kept: stderr then holds a rank's prints, its
logging, its progress bars and its traceback in the order written. (Lines of the two streams
read in one poll are not ordered between them: the files carry no times.)
"""

from __future__ import annotations

from collections import deque

from .budget import RankBudget
from .lines import PROGRESS_EVERY_S, ConsoleLine, Kind, LineSplitter, Piece, Stream

# The two copies of a print are written microseconds apart; the tailer reads the two streams in
# turns of 64 KiB (about 600 lines of 100 bytes), so the copies it sees apart are a few turns' lines.
ECHO_WINDOW_S, ECHO_LINES = 5.0, 2048
SKIP_NOTE_EVERY_S = 30.0


class EchoFilter:
    """A line written to one stream is dropped when the same line was written to the other stream
    in the last ``window_s`` and not yet matched. Bounded: at most ``size`` lines remembered, each
    by its hash (a collision drops one line in 2**64)."""

    def __init__(self, window_s: float = ECHO_WINDOW_S, size: int = ECHO_LINES) -> None:
        self._window = window_s
        self._size = size
        self._seq = 0
        # hash of a text -> (the stream of its unmatched copies, their sequence numbers, oldest first)
        self._pending: dict[int, tuple[Stream, deque[int]]] = {}
        self._order: deque[tuple[int, int, float]] = deque()  # (hash, seq, when), oldest first

    def admit(self, stream: Stream, text: str, now: float) -> bool:
        self._expire(now)
        key = hash(text)
        waiting = self._pending.get(key)
        if waiting is not None and waiting[0] is not stream:
            seqs = waiting[1]
            seqs.popleft()
            if not seqs:
                del self._pending[key]
            return False
        self._seq += 1
        if waiting is None:
            self._pending[key] = (stream, deque([self._seq]))
        else:
            waiting[1].append(self._seq)
        self._order.append((key, self._seq, now))
        return True

    def _expire(self, now: float) -> None:
        order = self._order
        while order and (len(order) > self._size or now - order[0][2] > self._window):
            key, seq, _ = order.popleft()
            waiting = self._pending.get(key)
            if waiting is not None and waiting[1] and waiting[1][0] == seq:
                waiting[1].popleft()
                if not waiting[1]:
                    del self._pending[key]

    def __len__(self) -> int:
        return len(self._order)


class RankConsole:
    """One attempt of one rank: what to send of each chunk its files grow by.

    ``budget`` is the rank's over the run (it outlives the attempt); the lines this attempt
    keeps rather than sends are in its ring until :meth:`end`.
    """

    def __init__(self, rank: int, budget: RankBudget, progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self.rank = rank
        self.budget = budget
        self._streams = {s: LineSplitter(progress_every_s=progress_every_s) for s in Stream}
        self._echo = EchoFilter()
        self._skipped = dict.fromkeys(Stream, 0)  # bytes skipped and not yet said
        self._skip_said: dict[Stream, float] = {}

    def feed(self, stream: Stream, data: bytes, now: float) -> list[ConsoleLine]:
        return self._route(stream, self._streams[stream].feed(data, now), now)

    def tick(self, now: float) -> list[ConsoleLine]:
        out: list[ConsoleLine] = []
        for stream, splitter in self._streams.items():
            piece = splitter.tick(now)
            if piece is not None:
                out += self._route(stream, [piece], now)
        return out

    def skipped(self, stream: Stream, nbytes: int, now: float) -> list[ConsoleLine]:
        """``nbytes`` of ``stream`` were not read (written faster than they could be): said at most
        once every ``SKIP_NOTE_EVERY_S`` a stream, the bytes of the skips in between summed."""
        out = self._route(stream, self._streams[stream].resync(), now)
        self._skipped[stream] += nbytes
        last = self._skip_said.get(stream)
        if last is None or now - last >= SKIP_NOTE_EVERY_S:
            out += self._skip_note(stream, now)
        return out

    def close(self, stream: Stream, now: float) -> list[ConsoleLine]:
        """``stream`` ended (its process is gone, its file read to the end)."""
        return self._route(stream, self._streams[stream].close(), now) + self._skip_note(stream, now)

    def _skip_note(self, stream: Stream, now: float) -> list[ConsoleLine]:
        nbytes, self._skipped[stream] = self._skipped[stream], 0
        if not nbytes:
            return []
        self._skip_said[stream] = now
        return [self._note(stream, f"{nbytes:,} bytes of its {stream.value} skipped: written faster than read")]

    def end(self, failed: bool, limit: int) -> list[ConsoleLine]:
        """The attempt ended: the lines kept back, when they are wanted (see ``budget``)."""
        if not (failed or self.budget.live_spent):
            self.budget.drop()
            return []
        note, lines = self.budget.last_lines(limit)
        return ([self._note(Stream.ERR, note)] if note else []) + lines

    @property
    def pending(self) -> int:
        """Bytes held in open lines (bounded: two streams of one line each)."""
        return sum(s.pending for s in self._streams.values())

    def _route(self, stream: Stream, pieces: list[Piece], now: float) -> list[ConsoleLine]:
        out: list[ConsoleLine] = []
        budget = self.budget
        for text, kind in pieces:
            if kind is Kind.PROGRESS:
                # A bar's state in passing is worth a live line, never a place among the last lines.
                if budget.live_left > 0:
                    budget.live_left -= 1
                    out.append(ConsoleLine(self.rank, stream, text, kind))
                continue
            if not self._echo.admit(stream, text, now):
                continue
            send, note = budget.admit(ConsoleLine(self.rank, stream, text, kind))
            if send is not None:
                out.append(send)
            if note is not None:
                out.append(self._note(stream, note))
        return out

    def _note(self, stream: Stream, text: str) -> ConsoleLine:
        return ConsoleLine(self.rank, stream, text, Kind.NOTE)
