"""The relay: node writers without a route to W&B send through the Train controller's node.

It is a forward proxy cut down to what wandb's client needs and nothing more:

- **HTTPS through CONNECT.** ``CONNECT api.wandb.ai:443``, then the relay copies bytes both ways
  and never holds a key or a certificate: TLS runs end to end between the writer's wandb-core
  and W&B, and the relay sees the host name of the request line and byte counts, nothing else.
- **Plain HTTP in absolute form** (a W&B server without TLS): ``POST http://host:port/path``,
  sent on in origin form with the hop's headers (``Proxy-Authorization`` first) left out, one
  request a connection (``Connection: close`` both ways): the client opens a new one for its
  next request.
- **Only to the allow-list** (``allow.py``): the run's W&B host, its storage host and the hosts
  the user lists, by name and port, checked once per connection before anything is sent on.
- **Only for the run's token**: ``Proxy-Authorization: Basic`` with the token as its password,
  compared in constant time; anything else is answered 407 and closed.
- **Bounded**: at most ``max_connections`` at once (503 past it), a head in ``head_timeout_s``
  and 16 KiB, an upstream connection in ``connect_timeout_s``, and a connection with no byte
  either way for ``idle_timeout_s`` is closed (wandb's client keeps an idle connection 90 s).
- **Logs host names only**: a target's ``host:port`` and why it was refused, once per host and
  reason; never a path, a header or the token.

**Why a relay of its own, not a proxy library.** The candidates on PyPI: proxy.py (BSD, 2.4.10,
about 14,200 lines: a general proxy server with plugins, a web server, TLS interception, and
acceptor processes made with ``multiprocessing``, which a Ray worker should not fork), pproxy
(MIT, 2.7.9, about 2,700 lines of many protocols and ciphers, upkeep slow) and mitmproxy (well
kept, but built to decrypt TLS: the one thing this relay must never do). What the plugin needs is
one route of two methods with an allow-list and a token: a few hundred lines of standard-library
asyncio (this module, ``heads.py`` and ``allow.py``) that a site's security reviewer reads in one
sitting, with no dependency to pin, patch or audit, no TLS code at all, and the same tests as the
rest of the plugin. Its cost is ours to keep: HTTP/1.1 heads are parsed here (``heads.py``),
strictly, and only the request line and ``Proxy-Authorization`` matter to the decision.

**Where it runs.** One :class:`Relay` is owned by one asyncio event loop; ``runner.py`` gives it a
loop on a thread of its own, and ``actor.py`` runs that in a small actor pinned to the
controller's node (see there why an actor, not a thread of the controller).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from .._config.secrets import Secret
from .allow import AllowList, Endpoint
from .heads import (
    CONNECTED,
    MAX_HEAD_BYTES,
    Refusal,
    RefusalError,
    RequestHead,
    authorized,
    close_response_head,
    interim,
    parse_head,
)

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_UPSTREAM_HEAD_BYTES = 64 * 1024
_BACKLOG = 1024  # 1,000 writers reconnecting at once (a relay restart) must not lose their SYNs


@dataclass(frozen=True)
class RelayConfig:
    """What a relay is: where it listens, whom it serves, where to, and its bounds."""

    allow: AllowList
    token: Secret
    host: str  # the address to listen on: the node's cluster-internal one, never 0.0.0.0
    port: int = 0  # 0: any free port
    max_connections: int = 4096  # clients at once; each takes two descriptors
    idle_timeout_s: float = 120.0
    head_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0


@dataclass(frozen=True)
class RelayStats:
    """A relay's counters since it started (plain data: it crosses from the relay's actor)."""

    open: int  # client connections now
    peak: int  # the most at once
    accepted: int
    tunnels: int  # CONNECT tunnels opened
    forwarded: int  # plain-HTTP requests sent on
    bytes_up: int  # client to W&B
    bytes_down: int  # W&B to client
    idle_closed: int
    refused: dict[str, int] = field(default_factory=dict)  # Refusal name -> count
    hosts: dict[str, int] = field(default_factory=dict)  # host:port -> connections served


class Relay:
    """One relay, owned by the event loop that runs :meth:`start`: every method is called on it."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._counts: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._hosts: Counter[str] = Counter()
        self._said: set[tuple[Refusal, str]] = set()
        self._open = self._peak = 0

    async def start(self) -> tuple[str, int]:
        """Listen; the address and port listened on."""
        self._server = await asyncio.start_server(
            self._serve, self.config.host, self.config.port, limit=MAX_HEAD_BYTES, backlog=_BACKLOG
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        log.info("relay listening on %s:%s for %s", host, port, ", ".join(self.config.allow.describe()))
        return str(host), int(port)

    async def stop(self) -> RelayStats:
        """Stop listening, close every connection, and say what it served."""
        if self._server is not None:
            self._server.close()
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
            refused=dict(self._refused),
            hosts=dict(self._hosts),
        )

    # one connection --------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._counts["accepted"] += 1
        if self._open >= self.config.max_connections:
            await self._refuse(writer, Refusal.BUSY, None)
            self._tasks.discard(task)  # type: ignore[arg-type]
            return
        self._open += 1
        self._peak = max(self._peak, self._open)
        upstream: asyncio.StreamWriter | None = None
        head: RequestHead | None = None
        try:
            head = parse_head(await self._read_head(reader))
            if not authorized(head, self.config.token.reveal()):
                raise RefusalError(Refusal.AUTH, "no or a wrong token")
            if not self.config.allow.allows(head.target):
                raise RefusalError(Refusal.NOT_ALLOWED, "not on the allow-list")
            up_reader, upstream = await self._connect(head.target)
            self._hosts[str(head.target)] += 1
            if head.tunnel:
                self._counts["tunnels"] += 1
                log.debug("relay: tunnel to %s", head.target)
                writer.write(CONNECTED)
            else:
                self._counts["forwarded"] += 1
                log.debug("relay: request to %s", head.target)
                upstream.write(head.forwarded())
            await self._splice(reader, writer, up_reader, upstream, rewrite=not head.tunnel)
        except RefusalError as e:
            await self._refuse(writer, e.refusal, head.target if head is not None else None)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a side went away: nothing to answer
        except asyncio.CancelledError:
            pass  # the relay stops: the connection ends here (asyncio's server logs a cancelled handler)
        finally:
            for w in (upstream, writer):
                if w is not None:
                    w.close()
            self._open -= 1
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.config.head_timeout_s)
        except asyncio.LimitOverrunError:
            raise RefusalError(Refusal.HEAD_TOO_LARGE, "a head over 16 KiB") from None
        except asyncio.TimeoutError:
            raise RefusalError(Refusal.HEAD_TIMEOUT, "no whole head in time") from None

    async def _connect(self, target: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port, limit=_UPSTREAM_HEAD_BYTES),
                self.config.connect_timeout_s,
            )
        except asyncio.TimeoutError:
            raise RefusalError(Refusal.UPSTREAM_TIMEOUT, "no answer from the host") from None
        except OSError as e:
            raise RefusalError(Refusal.UPSTREAM_FAILED, e.strerror or type(e).__name__) from None

    async def _refuse(self, writer: asyncio.StreamWriter, refusal: Refusal, target: Endpoint | None) -> None:
        self._refused[refusal.name] += 1
        where = str(target) if target is not None else "-"
        if (refusal, where) not in self._said:  # once per host and reason: a refused writer retries
            self._said.add((refusal, where))
            log.warning("relay: refused %s (%d %s)", where, refusal.status, refusal.value[1])
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
        *,
        rewrite: bool,
    ) -> None:
        """Copy both ways until the upstream's side ends (the client's ending is passed on as a
        half-close), or until neither side has sent a byte for ``idle_timeout_s``."""
        loop = asyncio.get_running_loop()
        last = [loop.time()]
        up = asyncio.ensure_future(self._pump(client_r, up_w, last, "up"))
        down = asyncio.ensure_future(self._pump(up_r, client_w, last, "down", rewrite=rewrite))
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

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        last: list[float],
        way: str,
        *,
        rewrite: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()
        while rewrite:  # a plain-HTTP answer: its final head says the connection closes
            head = await src.readuntil(b"\r\n\r\n")
            last[0] = loop.time()
            self._counts[way] += len(head)
            rewrite = interim(head)
            dst.write(head if rewrite else close_response_head(head))
        while True:
            data = await src.read(_CHUNK)
            if not data:
                return
            last[0] = loop.time()
            self._counts[way] += len(data)
            dst.write(data)
            await dst.drain()
