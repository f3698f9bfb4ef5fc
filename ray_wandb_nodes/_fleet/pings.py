"""Which node loggers the pool pings, in turn (``pool.py``): each at most every ``ping_s``, at
most ``PING_BATCH`` new pings a tick, and the pings in flight."""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from typing import Any

from .actors import RayActors
from .handle import LoggerHandle

# At most this many new pings a tick, in turn: a 1,000-node fleet pings each logger every ~47 s
# at a 3 s tick, never 1,000 calls a tick.
PING_BATCH = 64


class PingTurn:
    """Which loggers are pinged, in turn: at most ``PING_BATCH`` new pings a tick, each logger at
    most every ``ping_s``, in the order they were last pinged; and the pings in flight. The work a
    tick is bounded by the pings in flight, whatever the number of loggers."""

    def __init__(self, ping_s: float) -> None:
        self._ping_s = ping_s
        self._turn: collections.deque[str] = collections.deque()  # nodes in ping order
        self._in_turn: set[str] = set()
        self._in_flight: dict[str, LoggerHandle] = {}  # node -> handle with a ping in flight

    def add(self, node_id: str) -> None:
        if node_id not in self._in_turn:
            self._in_turn.add(node_id)
            self._turn.append(node_id)

    def drop(self, node_id: str) -> None:
        """A logger killed: its ping is not waited for (it leaves the turn when its turn comes)."""
        self._in_flight.pop(node_id, None)

    def answered(self, actors: RayActors) -> list[tuple[LoggerHandle, Any]]:
        """The pings answered since the last call: each logger's handle and its status call's ref."""
        if not self._in_flight:
            return []
        refs = actors.answered([h.ping for h in self._in_flight.values()])
        out = []
        for node_id, handle in list(self._in_flight.items()):
            if handle.ping in refs:
                del self._in_flight[node_id]
                ref, handle.ping = handle.ping, None
                out.append((handle, ref))
        return out

    def send(
        self, handles: Mapping[str, LoggerHandle], now: float, joining: Callable[[LoggerHandle], set[str]]
    ) -> None:
        """The next pings: each due logger with writers and no ping in flight asks its status;
        ``joining``: its writers whose join has not answered (no ping can find them missing)."""
        for _ in range(min(PING_BATCH, len(self._turn))):
            node_id = self._turn[0]
            held = handles.get(node_id)
            if held is None:  # dropped: out of the turn
                self._in_turn.discard(self._turn.popleft())
                continue
            if now - held.pinged < self._ping_s:
                break  # the turn is in ping order: the rest were pinged later
            self._turn.rotate(-1)
            if held.runs and held.ping is None:  # a ping is answered beside the writer calls, a join's first maybe
                held.ping, held.pinged = held.actor.status.remote(), now
                held.ping_runs = frozenset(held.runs - joining(held))
                self._in_flight[node_id] = held
