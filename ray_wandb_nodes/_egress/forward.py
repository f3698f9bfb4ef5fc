"""One plain-HTTP request sent on through the relay, and its answer sent back, both parsed and
written again by h11 (``heads.py`` reads the request's head).

The request goes to its host in origin form with ``Host`` naming that host, its body framed as
the client framed it (h11 checks that the bytes match: a client cannot slip a second request
into the first one's body), and ``Connection: close``; after its end nothing more is read from
the client. The answer goes back with the hop's headers left out and ``Connection: close``: the
client opens a new connection for its next request instead of finding this one closed under it.
Interim answers (``100 Continue``) go back as they come.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import h11

from .heads import HeadParser, Refusal, RefusalError, RequestHead, dropped

_CHUNK = 64 * 1024
_UPSTREAM_HEAD_BYTES = 64 * 1024


class UpstreamError(Exception):
    """The host's answer is not HTTP/1.x as h11 reads it (the client is answered 502)."""


async def forward(
    parser: HeadParser,
    head: RequestHead,
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    read: Callable[[asyncio.StreamReader], Awaitable[bytes]],
    count: Callable[[str, int], None],
) -> None:
    """Send ``head``'s request (its body read through ``parser``) to ``upstream`` and its answer
    to ``client``. ``read`` reads a chunk within the relay's idle bound; ``count(way, bytes)``."""
    (client_r, client_w), (up_r, up_w) = client, upstream
    to_host = h11.Connection(h11.CLIENT, max_incomplete_event_size=_UPSTREAM_HEAD_BYTES)
    server = parser.connection
    sent = to_host.send(head.upstream_request()) or b""
    up_w.write(sent)
    count("up", len(sent))
    data, parser.pending = parser.pending, b""
    while True:  # the request's body, as its framing says, then nothing more
        try:
            server.receive_data(data)
            event = server.next_event()
        except h11.RemoteProtocolError as e:
            raise RefusalError(Refusal.BAD_REQUEST, str(e)) from None
        if event is h11.NEED_DATA:
            data = await read(client_r)
            continue
        if isinstance(event, h11.Data):
            sent = to_host.send(event) or b""
        elif isinstance(event, h11.EndOfMessage):
            sent = to_host.send(h11.EndOfMessage()) or b""
        else:  # a client that stops sending mid-body
            raise RefusalError(Refusal.BAD_REQUEST, "the request's body ended early")
        up_w.write(sent)
        count("up", len(sent))
        await up_w.drain()
        if isinstance(event, h11.EndOfMessage):
            break
        data = b""
    while True:  # the answer
        try:
            event = to_host.next_event()
        except h11.RemoteProtocolError as e:
            raise UpstreamError(str(e)) from None
        if event is h11.NEED_DATA:
            data = await read(up_r)
            count("down", len(data))
            to_host.receive_data(data)
            continue
        assert isinstance(event, h11.Event)  # NEED_DATA handled above; a client never PAUSEs
        if isinstance(event, (h11.InformationalResponse, h11.Response)):
            headers = [(k, v) for k, v in event.headers.raw_items() if k.decode("latin-1").lower() not in _drop(event)]
            if isinstance(event, h11.Response):
                headers.append((b"Connection", b"close"))
            event = type(event)(status_code=event.status_code, headers=headers, reason=event.reason)
        elif isinstance(event, h11.ConnectionClosed):
            raise UpstreamError("the host closed the connection before its answer ended")
        client_w.write(server.send(event) or b"")
        await client_w.drain()
        if isinstance(event, h11.EndOfMessage):
            return


def _drop(event: h11.InformationalResponse | h11.Response) -> frozenset[str]:
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items()]
    return dropped(pairs)
