"""What the relay spends on a client before its token is checked, and what it keeps of refusals
(pure: the relay's event loop calls these; time is given, never read).

**Before the token.** A connection whose head is not read yet holds a place of a small budget of
its own, per peer and in all, never a place of ``max_connections`` (those are for holders of the
token). When a budget is full, its oldest connection is closed to make room: a writer sends its
head as soon as it connects (milliseconds), so what is old there is a socket held open without a
word, and a flood of such sockets, renewed as fast as a co-tenant likes, closes its own older
sockets, never a writer's. A head must also come within a short bound (``head_timeout_s``).

**Refusals.** Counted by reason only; the hosts refused to holders of the token (the run's own
writers: a storage host missing from ``egress_hosts``) are kept, up to ``HOSTS`` of them, for one
warning at the run's end. A line is logged for at most ``LINES`` refusals a minute, the client's
host escaped and cut; the lines left out are counted and said in the next one.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable

HOSTS = 32  # distinct refused hosts kept for the run's end; past them, counted under OTHER
OTHER = "other hosts"
LINES = 10  # log lines of refusals a minute
_MINUTE = 60.0


class Admission:
    """The connections before their token, by peer, oldest first."""

    def __init__(self, per_peer: int, total: int) -> None:
        if per_peer < 1 or total < per_peer:
            raise ValueError(f"the budget before the token needs 1 <= per_peer <= total, not {per_peer}, {total}")
        self.per_peer, self.total = per_peer, total
        self._all: OrderedDict[Hashable, str] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[Hashable, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, key: Hashable, peer: str) -> list[Hashable]:
        """``key`` (a connection from ``peer``) waits for its head; the connections to close to
        make room for it, oldest first (never ``key`` itself)."""
        mine = self._by_peer.setdefault(peer, OrderedDict())
        evicted: list[Hashable] = []
        if len(mine) >= self.per_peer:
            evicted.append(next(iter(mine)))
            self.done(evicted[-1])
        if len(self._all) >= self.total:
            evicted.append(next(iter(self._all)))
            self.done(evicted[-1])
        mine = self._by_peer.setdefault(peer, OrderedDict())
        mine[key] = None
        self._all[key] = peer
        return evicted

    def done(self, key: Hashable) -> None:
        """``key`` sent its head, or ended: its place is free (idempotent)."""
        peer = self._all.pop(key, None)
        if peer is None:
            return
        mine = self._by_peer[peer]
        mine.pop(key, None)
        if not mine:
            del self._by_peer[peer]


class Refusals:
    """The relay's refusals: counts by reason, the hosts refused to the run's writers, and
    whether a refusal gets a log line now."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.hosts: Counter[str] = Counter()  # "host:port (reason)" -> count, token holders' only
        self._window_start = float("-inf")
        self._lines = 0
        self.unlogged = 0  # refusals left out of the log since its last line

    def add(self, reason: str, host: str | None, now: float) -> bool:
        """Count a refusal (``host``: what a holder of the token asked for, else None); whether
        to log it now (at most ``LINES`` a minute)."""
        self.counts[reason] += 1
        if host is not None:
            key = f"{host} ({reason})"
            if key in self.hosts or len(self.hosts) < HOSTS:
                self.hosts[key] += 1
            else:
                self.hosts[OTHER] += 1
        if now - self._window_start >= _MINUTE:
            self._window_start, self._lines = now, 0
        if self._lines >= LINES:
            self.unlogged += 1
            return False
        self._lines += 1
        return True

    def take_unlogged(self) -> int:
        """Refusals left out of the log before this line (and none from now)."""
        n, self.unlogged = self.unlogged, 0
        return n
