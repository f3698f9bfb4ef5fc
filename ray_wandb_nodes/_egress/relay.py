"""The relay: node writers without a route to W&B send through the Train controller's node.

It is a forward proxy cut down to what wandb's client needs and nothing more:

- **HTTPS through CONNECT.** ``CONNECT api.wandb.ai:443``, then the relay copies bytes both ways
  and never holds a key or a certificate: TLS runs end to end between the writer's wandb-core
  and W&B, and the relay sees the host name of the request line and byte counts, nothing else.
- **Plain HTTP in absolute form** (a W&B server without TLS): ``POST http://host:port/path``,
  parsed and sent on by h11 (``forward.py``) in origin form, ``Host`` naming the host, the hop's
  headers (``Proxy-Authorization`` first) left out, one request a connection
  (``Connection: close`` both ways): the client opens a new one for its next request.
- **Only to the allow-list** (``allow.py``): the run's W&B host, its storage host and the hosts
  the user lists, by name and port, checked once per connection before anything is sent on;
  the name resolved fully qualified, never to the node's own or link's addresses
  (``upstream.py``), or through the site's proxy where the driver was given one.
- **Only for the run's token**: ``Proxy-Authorization: Basic`` with the token as its password,
  compared in constant time; anything else is answered 407 and closed.
- **From the cluster's nodes** (where ``peers`` says which: the actor asks Ray): any other peer
  is closed without a word.
- **Bounded before the token** (``admit.py``): a connection whose head is not read holds a place
  of a budget of its own (``unauthenticated_per_peer``, ``unauthenticated_total``; the oldest
  makes room), never one of ``max_connections``, and its head must come in ``head_timeout_s``
  and 16 KiB. Refusals are counted by reason, and logged at most ten a minute.
- **Bounded after it**: at most ``max_connections`` token holders at once (503 past it), an
  upstream connection in ``connect_timeout_s``, and a connection with no byte either way for
  ``idle_timeout_s`` is closed (wandb's client keeps an idle connection 90 s).
- **Logs host names only**: a target's ``host:port`` (escaped and cut) and why it was refused;
  never a path, a header or the token.

**Why a relay of its own, not a proxy library.** The candidates on PyPI: proxy.py (BSD, 2.4.10,
about 14,200 lines: a general proxy server with plugins, a web server, TLS interception, and
acceptor processes made with ``multiprocessing``, which a Ray worker should not fork), pproxy
(MIT, 2.7.9, about 2,700 lines of many protocols and ciphers, upkeep slow) and mitmproxy (well
kept, but built to decrypt TLS: the one thing this relay must never do). What the plugin needs is
one route of two methods with an allow-list and a token: a few hundred lines of asyncio (this
module, ``heads.py``, ``forward.py``, ``upstream.py``, ``admit.py`` and ``allow.py``) that a
site's security reviewer reads in one sitting, with no TLS code at all. HTTP/1.1 is parsed and
written by h11 (the kept sans-I/O library Ray's dependencies already install), never by hand;
the allow-list's wildcards are judged by the Public Suffix List (``publicsuffixlist``).

**Where it runs.** One :class:`Relay` is owned by one asyncio event loop; ``runner.py`` gives it a
loop on a thread of its own, and ``actor.py`` runs that in a small actor pinned to the
controller's node (see there why an actor, not a thread of the controller).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .._config.secrets import Secret
from .admit import Admission, Refusals
from .allow import AllowList, Endpoint, normal_host
from .forward import UpstreamError, forward
from .heads import CONNECTED, HeadParser, Refusal, RefusalError, RequestHead, authorized, shown
from .upstream import open_upstream, site_proxy

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_BACKLOG = 1024  # 1,000 writers connecting at once must not lose their SYNs
_PEERS_EVERY_S = 2.0  # the cluster's nodes asked again at most this often (on an unknown peer)
NOT_A_NODE, EVICTED = "NOT_A_NODE", "EVICTED"  # refusals without an answer


@dataclass(frozen=True)
class RelayConfig:
    """What a relay is: where it listens, whom it serves, where to, and its bounds."""

    allow: AllowList
    token: Secret
    host: str  # the address to listen on: the node's cluster-internal one, never 0.0.0.0
    port: int = 0  # 0: a free port, chosen as it binds
    max_connections: int = 4096  # token holders at once; each takes two descriptors
    idle_timeout_s: float = 120.0
    head_timeout_s: float = 5.0  # a writer sends its head at once
    connect_timeout_s: float = 10.0
    unauthenticated_per_peer: int = 64  # connections before their head, from one address
    unauthenticated_total: int = 4096  # ... from all: every writer of 1,000 nodes connecting at once fits
    # The addresses of the cluster's nodes, the only peers served (None: any); called off the
    # event loop, again on an unknown peer at most every _PEERS_EVERY_S.
    peers: Callable[[], Iterable[str]] | None = None
    # The driver's proxy variables (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, either case): the relay
    # goes through the site's proxy as wandb's client there would.
    proxy_env: tuple[tuple[str, Secret], ...] = ()


@dataclass(frozen=True)
class RelayStats:
    """A relay's counters since it started (plain data: it crosses from the relay's actor)."""

    open: int  # token holders' connections now
    peak: int  # the most at once
    accepted: int
    tunnels: int  # CONNECT tunnels opened
    forwarded: int  # plain-HTTP requests sent on
    bytes_up: int  # client to W&B
    bytes_down: int  # W&B to client
    idle_closed: int
    refused: dict[str, int] = field(default_factory=dict)  # Refusal name (NOT_A_NODE, EVICTED) -> count
    hosts: dict[str, int] = field(default_factory=dict)  # host:port -> connections served
    # "host:port (REASON)" -> refusals of token holders (the run's writers), at most admit.HOSTS
    refused_hosts: dict[str, int] = field(default_factory=dict)


class Relay:
    """One relay, owned by the event loop that runs :meth:`start`: every method is called on it."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._counts: Counter[str] = Counter()
        self._refusals = Refusals()
        self._hosts: Counter[str] = Counter()
        self._admission = Admission(config.unauthenticated_per_peer, config.unauthenticated_total)
        self._environ = {k: v.reveal() for k, v in config.proxy_env}
        self._peers: frozenset[str] = frozenset()
        self._peers_at = float("-inf")
        self._reading_peers: asyncio.Future[None] | None = None
        self._open = self._peak = 0

    async def start(self) -> tuple[str, int]:
        """Listen; the address and port listened on."""
        if self.config.peers is not None:
            await self._read_peers(0.0)
        self._server = await asyncio.start_server(self._serve, self.config.host, self.config.port, backlog=_BACKLOG)
        host, port = self._server.sockets[0].getsockname()[:2]
        log.info("relay listening on %s:%s for %s", host, port, ", ".join(self.config.allow.describe()))
        return str(host), int(port)

    async def stop(self) -> RelayStats:
        """Stop listening, close every connection, and say what it served."""
        if self._server is not None:
            self._server.close()
        if self._reading_peers is not None:
            self._reading_peers.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        stats = self.stats()
        log.info(
            "relay stopped: %d connections, %d bytes up, %d down, refused %s",
            stats.accepted, stats.bytes_up, stats.bytes_down, stats.refused or "none",
        )  # fmt: skip
        return stats

    def stats(self) -> RelayStats:
        c = self._counts
        return RelayStats(
            open=self._open,
            peak=self._peak,
            accepted=c["accepted"],
            tunnels=c["tunnels"],
            forwarded=c["forwarded"],
            bytes_up=c["up"],
            bytes_down=c["down"],
            idle_closed=c["idle"],
            refused=dict(self._refusals.counts),
            hosts=dict(self._hosts),
            refused_hosts=dict(self._refusals.hosts),
        )

    # one connection --------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._counts["accepted"] += 1
        peer = _peer(writer)
        for evicted in self._admission.admit(task, peer):
            self._refused(EVICTED, None, None)
            evicted.cancel()  # type: ignore[attr-defined]
        upstream: asyncio.StreamWriter | None = None
        head: RequestHead | None = None
        holder = counted = False
        try:
            if not await self._known(peer):
                self._refused(NOT_A_NODE, None, None)
                return
            parser = HeadParser()
            head = await self._read_head(reader, parser)
            self._admission.done(task)
            if not authorized(head, self.config.token.reveal()):
                raise RefusalError(Refusal.AUTH, "no or a wrong token")
            holder = True
            if self._open >= self.config.max_connections:
                raise RefusalError(Refusal.BUSY, "max_connections reached")
            self._open += 1
            counted = True
            self._peak = max(self._peak, self._open)
            if not self.config.allow.allows(head.target):
                raise RefusalError(Refusal.NOT_ALLOWED, "not on the allow-list")
            proxy = site_proxy(head.target, head.tunnel, self._environ)
            up_reader, upstream = await open_upstream(
                head.target, self.config.allow, proxy, self.config.connect_timeout_s
            )
            self._hosts[str(head.target)] += 1
            if head.tunnel:
                self._counts["tunnels"] += 1
                log.debug("relay: tunnel to %s", head.target)
                writer.write(CONNECTED)
                if parser.pending:
                    upstream.write(parser.pending)
                    self._counts["up"] += len(parser.pending)
                await self._splice(reader, writer, up_reader, upstream)
            else:
                self._counts["forwarded"] += 1
                log.debug("relay: request to %s", head.target)
                await forward(parser, head, (reader, writer), (up_reader, upstream), self._read, self._count)
        except RefusalError as e:
            await self._refuse(writer, e.refusal, head.target if head is not None else None, holder)
        except UpstreamError:
            await self._refuse(writer, Refusal.UPSTREAM_FAILED, head.target if head is not None else None, holder)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a side went away: nothing to answer
        except asyncio.CancelledError:
            pass  # the relay stops, or an unauthenticated connection made room: it ends here
        except Exception as e:  # noqa: BLE001 - a bug here ends one connection, never the relay
            self._refused(f"ERROR {type(e).__name__}", None, None)
        finally:
            self._admission.done(task)
            for w in (upstream, writer):
                if w is not None:
                    w.close()
            if counted:
                self._open -= 1
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _known(self, peer: str) -> bool:
        """Whether ``peer`` is one of the cluster's nodes (asking again, shared by every miss,
        no sooner than ``_PEERS_EVERY_S`` after the last time)."""
        if self.config.peers is None or peer in self._peers:
            return True
        if self._reading_peers is None or self._reading_peers.done():
            wait = max(0.0, self._peers_at + _PEERS_EVERY_S - asyncio.get_running_loop().time())
            self._reading_peers = asyncio.ensure_future(self._read_peers(wait))
        await asyncio.shield(self._reading_peers)
        return peer in self._peers

    async def _read_peers(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        loop = asyncio.get_running_loop()
        peers = self.config.peers
        assert peers is not None
        try:
            found = await loop.run_in_executor(None, lambda: frozenset(normal_host(p) for p in peers()))
            self._peers = found
        except Exception as e:  # noqa: BLE001 - the nodes known before stay known
            log.warning("relay: the cluster's nodes could not be read (%s)", type(e).__name__)
        self._peers_at = loop.time()

    async def _read_head(self, reader: asyncio.StreamReader, parser: HeadParser) -> RequestHead:
        async def read() -> RequestHead:
            while True:
                data = await reader.read(_CHUNK)
                if not data and not parser.started:
                    raise OSError("closed before a byte")  # a port check, a client that changed its mind
                head = parser.feed(data)
                if head is not None:
                    return head

        try:
            return await asyncio.wait_for(read(), self.config.head_timeout_s)
        except asyncio.TimeoutError:
            raise RefusalError(Refusal.HEAD_TIMEOUT, "no whole head in time") from None

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        """A chunk within the idle bound (a plain-HTTP request and its answer)."""
        try:
            return await asyncio.wait_for(reader.read(_CHUNK), self.config.idle_timeout_s)
        except asyncio.TimeoutError:
            self._counts["idle"] += 1
            raise OSError("idle") from None

    def _count(self, way: str, n: int) -> None:
        self._counts[way] += n

    def _refused(self, reason: str, target: Endpoint | None, holder: bool | None) -> None:
        """Count a refusal, and log it within the bound (``holder``: the client had the token)."""
        host = str(target) if target is not None else None
        if self._refusals.add(reason, host if holder else None, asyncio.get_running_loop().time()):
            unlogged = self._refusals.take_unlogged()
            more = f"; {unlogged} refusals before this one not logged" if unlogged else ""
            log.warning("relay: refused %s (%s)%s", shown(host) if host else "-", reason, more)

    async def _refuse(
        self, writer: asyncio.StreamWriter, refusal: Refusal, target: Endpoint | None, holder: bool
    ) -> None:
        self._refused(refusal.name, target, holder)
        try:
            writer.write(refusal.response())
            await asyncio.wait_for(writer.drain(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    async def _splice(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        """Copy both ways until the upstream's side ends (the client's ending is passed on as a
        half-close), or until neither side has sent a byte for ``idle_timeout_s``."""
        loop = asyncio.get_running_loop()
        last = [loop.time()]
        up = asyncio.ensure_future(self._pump(client_r, up_w, last, "up"))
        down = asyncio.ensure_future(self._pump(up_r, client_w, last, "down"))
        pending: set[asyncio.Future[None]] = {up, down}
        try:
            while down in pending:
                left = last[0] + self.config.idle_timeout_s - loop.time()
                if left <= 0:
                    self._counts["idle"] += 1
                    log.debug("relay: closed an idle connection")
                    return
                done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if up in done:
                    if up.exception() is not None:
                        return
                    if up_w.can_write_eof():
                        up_w.write_eof()
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, last: list[float], way: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await src.read(_CHUNK)
            if not data:
                return
            last[0] = loop.time()
            self._counts[way] += len(data)
            dst.write(data)
            await dst.drain()


def _peer(writer: asyncio.StreamWriter) -> str:
    peername = writer.get_extra_info("peername")
    return normal_host(str(peername[0])) if peername else ""
