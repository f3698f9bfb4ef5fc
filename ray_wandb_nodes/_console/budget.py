"""How many of the ranks' lines a run's console takes, and whose (pure).

W&B stores at most 100,000 console lines a run (docs: "Console logs"); what comes after is not
kept. The plugin takes :data:`PLUGIN_LINES` of them and leaves the rest to the primary writer's
own console (the Train controller's output, where a user turns its capture on) and to wandb's
lines. Of the plugin's share:

- **live** lines go to the run as the rank writes them: rank 0's (``console="rank0"``, the
  default) or every rank's, an equal share each (``"all"``);
- every rank keeps its **last lines** (a ring of ``tail`` lines, the lines not sent live): when
  its attempt fails (a rank raised or died, a hang ended the attempt) they go to the run, its
  traceback with them; a rank whose live share is spent has its last lines sent at the end of
  every attempt, failed or not.

Whose last lines first, when they cannot all go: a failed attempt's **dead ranks** (those Ray's
deciding poll found raised, dead or silent, and the ranks a hang named stopped) before any other,
in every attempt. Half of the last lines are the run's pool for dead ranks (``dead_tails``), shared
out by the driver side, which knows every node's dead ranks (:func:`dead_allowance`); the other
half is shared by the nodes (``node_tails`` each) for the rest: a dead rank the pool could not
serve, then a rank whose process a node saw end before its attempt did, then the others by rank.
Each attempt takes at most half of what is left of either (:func:`attempt_share`), so a later
attempt's failure always finds lines left.

``console="failures"`` sends no live line (every rank's last lines when an attempt fails), and
``"off"`` sends nothing. A line left out is counted and said, once per rank and cause, in a
line of its own (:class:`RankBudget`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from .._config.values import ConsoleMode, spellings
from .lines import ConsoleLine

RUN_LINES = 100_000  # W&B keeps at most this many console lines a run
PLUGIN_LINES = 90_000  # the plugin's share of them
TAIL_LINES = 20_000  # of the plugin's share: the ranks' last lines, over the run
TAIL_MAX, TAIL_MIN = 200, 20  # one rank's last lines: a traceback of a deep stack fits in 200


@dataclass(frozen=True)
class ConsolePlan:
    """A run's console budget; the same for every node (each applies it to its own ranks)."""

    mode: ConsoleMode
    live_rank0: int  # lines rank 0 may send live over the run
    live_other: int  # lines each other rank may send live over the run
    tail: int  # last lines each rank keeps for its attempt's failure
    node_tails: int  # last lines one node may send over the run (dead ranks' allowances aside)
    dead_tails: int  # the run's pool of last lines for its failed attempts' dead ranks

    def live(self, rank: int) -> int:
        return self.live_rank0 if rank == 0 else self.live_other

    @property
    def on(self) -> bool:
        return self.mode is not ConsoleMode.OFF


def plan_console(mode: ConsoleMode | str, world_size: int, nodes: int) -> ConsolePlan:
    """The budget of a run of ``world_size`` ranks on ``nodes`` nodes (``mode``: a member, or how
    a user writes it)."""
    try:
        mode = ConsoleMode(mode)
    except ValueError:
        raise ValueError(f"console mode {mode!r} is not one of {', '.join(spellings(ConsoleMode))}") from None
    world_size, nodes = max(world_size, 1), max(nodes, 1)
    if mode is ConsoleMode.OFF:
        return ConsolePlan(mode, 0, 0, 0, 0, 0)
    tails = PLUGIN_LINES if mode is ConsoleMode.FAILURES else TAIL_LINES
    tail = min(TAIL_MAX, max(TAIL_MIN, tails // world_size))
    dead = tails // 2
    node_tails = (tails - dead) // nodes
    live = PLUGIN_LINES - TAIL_LINES
    if mode is ConsoleMode.RANK0:
        return ConsolePlan(mode, live, 0, tail, node_tails, dead)
    if mode is ConsoleMode.ALL:
        share = live // world_size
        return ConsolePlan(mode, share, share, tail, node_tails, dead)
    return ConsolePlan(mode, 0, 0, tail, node_tails, dead)


def attempt_share(left: int) -> int:
    """What one attempt's end may take of ``left`` last lines: half, so that the next attempt finds
    as many; all of the last few (under ``TAIL_MIN``), which halving would never spend."""
    left = max(left, 0)
    return max(left // 2, min(left, TAIL_MIN))


def dead_allowance(dead: Sequence[int], tail: int, left: int) -> dict[int, int]:
    """Each dead rank's last lines from the run's pool (``left`` lines) for one failed attempt:
    ``dead`` in the order they matter (the first named first), ``tail`` each at most. The attempt
    takes :func:`attempt_share` of the pool; where that cannot give every dead rank ``TAIL_MIN``
    lines, the first ranks get ``TAIL_MIN`` each while it lasts, the next what is left, the rest
    none (0: still dead, first in their nodes' own share). Ranks named twice count once."""
    ranks = list(dict.fromkeys(dead))
    if not ranks or tail <= 0:
        return {}
    share = attempt_share(left)
    each = min(tail, share // len(ranks))
    if each >= min(TAIL_MIN, tail):
        return dict.fromkeys(ranks, each)
    each = min(TAIL_MIN, tail)
    out: dict[int, int] = {}
    for rank in ranks:
        out[rank] = min(each, share)
        share -= out[rank]
    return out


class RankBudget:
    """One rank's lines over the run: live while its share lasts, then into its ring of last lines.

    ``admit`` says what to send now for one line: the line, or nothing (kept in the ring), plus
    one note the first time the rank's live share runs out. ``last_lines`` empties the ring,
    preceded by a note of how many lines fell out of it. The live count lasts the run (a retried
    attempt continues it); the ring is one attempt's.
    """

    def __init__(self, live: int, tail: int) -> None:
        self._live_total = live
        self.live_left = live
        self._ring: deque[ConsoleLine] = deque(maxlen=max(tail, 0))
        self._fell_out = 0  # lines of this attempt neither sent nor in the ring
        self._said_spent = False

    def admit(self, line: ConsoleLine) -> tuple[ConsoleLine | None, str | None]:
        """(the line to send now, a note to send now); either may be None."""
        if self.live_left > 0:
            self.live_left -= 1
            return line, None
        ring = self._ring
        if ring.maxlen == 0:
            self._fell_out += 1
        else:
            if len(ring) == ring.maxlen:
                self._fell_out += 1
            ring.append(line)
        if self._live_total > 0 and not self._said_spent:
            self._said_spent = True
            keep = f"; its last {ring.maxlen} lines are sent when its attempt ends" if ring.maxlen else ""
            return None, f"the run's console share of this rank ({self._live_total:,} lines) is spent{keep}"
        return None, None

    def replan(self, live: int) -> None:
        """The run's plan changed: this rank's live share over the run is ``live`` now."""
        sent = self._live_total - self.live_left
        self._live_total, self.live_left = live, max(live - sent, 0)

    @property
    def live_spent(self) -> bool:
        return self._live_total > 0 and self.live_left == 0

    @property
    def held(self) -> int:
        """Lines in the ring."""
        return len(self._ring)

    def last_lines(self, limit: int) -> tuple[str | None, list[ConsoleLine]]:
        """(a note of the lines left out, the newest ``limit`` lines of the ring); empties the ring."""
        if self._ring.maxlen == 0:  # a rank that keeps no last lines has nothing to say of them
            self._fell_out = 0
            return None, []
        lines = list(self._ring)
        self._ring.clear()
        left_out = self._fell_out + max(len(lines) - limit, 0)
        limit = max(limit, 0)
        lines = lines[len(lines) - limit :] if limit < len(lines) else lines
        self._fell_out = 0
        if not lines and not left_out:
            return None, []
        if not left_out:
            note = None
        elif lines:
            note = f"{left_out:,} earlier lines not kept; its last {len(lines)} follow"
        else:
            note = f"its last {left_out:,} lines not sent: this node's share of the run's last lines is spent"
        return note, lines

    def drop(self) -> None:
        """The attempt ended well and these lines are not wanted: forget them."""
        self._ring.clear()
        self._fell_out = 0
