"""From the bytes a rank wrote to one stream to the lines the run's console shows (pure).

A :class:`LineSplitter` takes the bytes of one of a rank's files as they are read, in chunks
of any size, and gives back finished lines. Its memory is bounded whatever the rank writes:
one line's current state, cut at :data:`MAX_LINE_BYTES`.

Progress bars (tqdm, Lightning's, Ray Data's) redraw one line with carriage returns. Into a
file that is one line of many states (``\\r 10%|█ ...\\r 20%|██ ...``) ended by a newline when
the bar closes. The rules, exactly:

1. Within a line, a ``\\r`` begins a new state of that line; the line shows its last state that
   is not empty (so ``"50%\\r"`` shows ``50%``, and ``"50%\\rdone"`` shows ``done``).
2. While such a line stays open (no newline yet), its current state is sent as a line of its
   own at most once every ``progress_every_s`` (a bar of an hour at 30 s: 120 lines, never
   the thousands of states it drew), and only when it changed since the last one sent.
3. When the line ends, its last state is sent, unless it is the state sent last.

Terminal control sequences that move the cursor or erase (``ESC [ A``, ``ESC [ K``, ...) are
dropped; colours (``ESC [ ... m``) are kept, as the Logs tab shows them. Ray's own markers
(``:job_id:``, ``:actor_name:``, ``:task_name:`` at the start of a line, which its log monitor
reads to name the worker) are dropped.
"""

from __future__ import annotations

import enum
import re
from typing import NamedTuple

# wandb-core cuts a console line at 4,096 characters (runconsolelogs' maxTerminalLineLength);
# a line longer than that in bytes keeps its first MAX_LINE_BYTES (less the bytes of a character
# the cut would split: ``char_cut``) and says how many were cut.
MAX_LINE_BYTES = 4096
PROGRESS_EVERY_S = 30.0
# Lines Ray writes into every worker's .out and .err for its log monitor (ray_constants.LOG_PREFIX_*,
# 2.50 to 2.60): not the rank's output.
RAY_MARKERS = (b":job_id:", b":actor_name:", b":task_name:", b":event_summary:", b":info_message:")
# A CSI sequence whose final byte is not ``m`` (a colour): cursor moves, erasing, modes.
_CONTROL = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-ln-~]|\x1b[()][A-Za-z0-9]|\x1b[=>78]")


class Stream(str, enum.Enum):
    """Which of a rank's files a line came from."""

    OUT = "stdout"
    ERR = "stderr"


class Kind(str, enum.Enum):
    """What a line of the run's console is."""

    TEXT = "text"  # a line the rank wrote
    PROGRESS = "progress"  # a progress bar's state, the line still open (rule 2)
    NOTE = "note"  # the plugin's own word about the rank's lines (left out, cut, skipped)


class ConsoleLine(NamedTuple):
    """One line for the run's Logs tab: whose, from where, what."""

    rank: int
    stream: Stream
    text: str
    kind: Kind = Kind.TEXT


class Piece(NamedTuple):
    """A finished line of one stream (the splitter does not know whose it is)."""

    text: str
    kind: Kind


def char_cut(data: bytes | bytearray, at: int) -> int:
    """Where to cut ``data`` to keep at most ``at`` bytes without splitting a UTF-8 character:
    ``at``, or less by the bytes of the character that would straddle the cut (at most 3).
    Bytes that are no UTF-8 are cut where they fall (they decode as U+FFFD either way)."""
    at = min(at, len(data))
    # The lead byte of the last character that starts before the cut, within 3 bytes of it.
    for back in range(1, min(4, at) + 1):
        byte = data[at - back]
        if byte < 0x80:  # ASCII: no character straddles
            return at
        if byte >= 0xC0:  # a lead byte: the character's length, from its high bits
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4 if byte < 0xF8 else 1
            return at - back if back < need else at
    return at  # continuation bytes only: no character to keep whole


def _clean(raw: bytes) -> str:
    if b"\x1b" in raw:
        raw = _CONTROL.sub(b"", raw)
    return raw.decode("utf-8", errors="replace")


class LineSplitter:
    """One stream of one rank: bytes in, finished lines out (see the module's rules).

    ``feed`` takes each chunk as read, ``tick`` sends an open progress line's state when it is
    due, ``close`` ends the stream (its process is gone and the file read to its end), and
    ``resync`` says that bytes were skipped: what follows starts mid-line, up to its newline.
    Times are the caller's clock in seconds (a test's, or ``time.monotonic()``).
    """

    def __init__(self, max_bytes: int = MAX_LINE_BYTES, progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self._max = max_bytes
        self._every = progress_every_s
        self._state = bytearray()  # the open line's current state, at most max_bytes
        self._cut = 0  # bytes of the current state beyond max_bytes
        self._fresh = False  # a \r was the last byte: the next byte begins a new state
        self._progress = False  # the open line has had a \r: it is a progress line
        self._sent: bytes | None = None  # the open line's state sent last (rule 2), if any
        self._sent_at: float | None = None
        self._opened_at: float | None = None
        self._skipping = False  # after a resync: drop bytes up to the next newline

    def feed(self, data: bytes, now: float) -> list[Piece]:
        out: list[Piece] = []
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return out
            self._skipping = False
            data = data[end + 1 :]
        parts = data.split(b"\n")
        if self._opened_at is None and b"\r" not in data:  # the common case: no open line, plain lines
            for raw in parts[:-1]:
                if not raw.startswith(RAY_MARKERS):
                    if len(raw) > self._max:
                        keep = char_cut(raw, self._max)
                        out.append(Piece(self._text(raw[:keep], len(raw) - keep), Kind.TEXT))
                    else:
                        out.append(Piece(self._text(raw, 0), Kind.TEXT))
            self._append(parts[-1], now)
            return out
        for i, part in enumerate(parts):
            if i < len(parts) - 1:
                self._append(part, now)
                piece = self._end_line()
                if piece is not None:
                    out.append(piece)
            elif part:
                self._append(part, now)
        return out

    def tick(self, now: float) -> Piece | None:
        """The open progress line's current state, if one is due (rule 2)."""
        if not self._progress or not self._state or self._opened_at is None:
            return None
        since = self._sent_at if self._sent_at is not None else self._opened_at
        if now - since < self._every:
            return None
        state = bytes(self._state)
        self._sent_at = now
        if state == self._sent:
            return None
        self._sent = state
        return Piece(self._text(state, self._cut), Kind.PROGRESS)

    def close(self) -> list[Piece]:
        """The stream ended: the open line, if any, as its last state."""
        if self._skipping or not self._state:  # no open line (or only carriage returns)
            self._skipping = False
            self._reset()
            return []
        piece = self._end_line()
        return [piece] if piece is not None else []

    def resync(self) -> list[Piece]:
        """Bytes were skipped: end the open line, then drop what follows up to a newline."""
        out = self.close()
        self._skipping = True
        return out

    @property
    def pending(self) -> int:
        """Bytes of the open line held (bounded by ``max_bytes``)."""
        return len(self._state)

    def _append(self, part: bytes, now: float) -> None:
        if not part:
            return
        if self._opened_at is None:
            self._opened_at = now
        if b"\r" in part:
            self._progress = True
            states = part.split(b"\r")
            self._extend(states[0])
            for state in states[1:]:
                self._fresh = True
                self._extend(state)
        else:
            self._extend(part)

    def _extend(self, state: bytes) -> None:
        if not state:
            return
        if self._fresh:  # a new state overwrites the line (rule 1)
            self._state.clear()
            self._cut = 0
            self._fresh = False
        if self._cut:  # the state was cut: the rest of it goes with the cut
            self._cut += len(state)
            return
        room = self._max - len(self._state)
        if len(state) <= room:
            self._state += state
            return
        self._cut += len(state) - room
        self._state += state[:room]
        # The cut at the line's cap: a character it splits goes with the bytes cut.
        keep = char_cut(self._state, len(self._state))
        self._cut += len(self._state) - keep
        del self._state[keep:]

    def _end_line(self) -> Piece | None:
        state, cut, progress, sent = bytes(self._state), self._cut, self._progress, self._sent
        self._reset()
        if state.startswith(RAY_MARKERS):
            return None
        if progress and state == sent:
            return None  # rule 3: the state sent last
        return Piece(self._text(state, cut), Kind.TEXT)

    def _reset(self) -> None:
        self._state.clear()
        self._cut = 0
        self._fresh = self._progress = False
        self._sent = self._sent_at = self._opened_at = None

    @staticmethod
    def _text(state: bytes, cut: int) -> str:
        text = _clean(state)
        return f"{text} [... {cut:,} more bytes]" if cut else text
