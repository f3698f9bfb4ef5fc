"""The relay's reading of a client's request head and the answers it gives (pure).

A client asks for a tunnel with ``CONNECT host:port`` (HTTPS: the relay then copies bytes it
cannot read), or sends a plain-HTTP request in absolute form, ``POST http://host:port/path``
(a W&B server without TLS). The head is parsed by h11 (a kept HTTP/1.1 library, which Ray's own
dependencies install): its request line, header names and values, line endings, folded lines and
framing (``Content-Length``, ``Transfer-Encoding``) are judged as RFC 9112 says, never by hand.
On top, the relay refuses what h11 lets by and a proxy must not: a control character in a value,
both framings at once, a version other than 1.0 and 1.1, and a host that is neither a DNS name of
letters, digits and hyphens nor an IP address (so that no resolver ever sees other bytes).

The head is read once per connection: everything after it goes to the one host the head named,
which the relay checked, so a second request on the connection cannot reach another host.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import ipaddress
import re
from dataclasses import dataclass

import h11

from .allow import HTTP_PORT, Endpoint

MAX_HEAD_BYTES = 16 * 1024
# Headers of one hop, never sent on (RFC 9110 7.6.1): the relay's own credentials, and what would
# keep a connection open or change its protocol (each request gets a connection of its own).
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection", "te",
        "trailer", "upgrade", "expect",
    }
)  # fmt: skip
# Never removed, whatever a Connection header lists: the message's framing and its host (which the
# relay writes itself). A client that could strip them would make the host read another message.
KEPT = frozenset({"content-length", "transfer-encoding", "host"})
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # in a value: anything below a space but a tab
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: "²" is a digit to str.isdigit()
_SHOWN = 64  # characters of a client's host a log line shows


class Refusal(enum.Enum):
    """Why the relay said no: the HTTP status it answers, and the words of its status line."""

    BAD_REQUEST = (400, "Bad Request")
    NOT_ALLOWED = (403, "Forbidden")
    AUTH = (407, "Proxy Authentication Required")
    HEAD_TIMEOUT = (408, "Request Timeout")
    HEAD_TOO_LARGE = (431, "Request Header Fields Too Large")
    NOT_IMPLEMENTED = (501, "Not Implemented")
    UPSTREAM_FAILED = (502, "Bad Gateway")
    BUSY = (503, "Service Unavailable")
    UPSTREAM_TIMEOUT = (504, "Gateway Timeout")

    @property
    def status(self) -> int:
        return self.value[0]

    def response(self) -> bytes:
        """The whole answer: a status line, no body, the connection closed after it."""
        status, words = self.value
        extra = 'Proxy-Authenticate: Basic realm="ray_wandb_nodes relay"\r\n' if self is Refusal.AUTH else ""
        return f"HTTP/1.1 {status} {words}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n".encode()


CONNECTED = b"HTTP/1.1 200 Connection Established\r\n\r\n"
_BY_STATUS = {r.status: r for r in Refusal}


class RefusalError(ValueError):
    """A head the relay will not serve, and the answer it gets."""

    def __init__(self, refusal: Refusal, why: str) -> None:
        super().__init__(why)
        self.refusal = refusal


def shown(host: str) -> str:
    """A client's host as a log line may show it: escaped (``%r``) and cut."""
    return repr(host if len(host) <= _SHOWN else host[:_SHOWN] + "...")


@dataclass(frozen=True)
class RequestHead:
    """A client's request head as the relay reads it."""

    method: str
    target: Endpoint
    tunnel: bool  # CONNECT; False: a plain-HTTP request in absolute form
    path: str  # the origin-form target the request is sent on with ("" for a tunnel)
    version: str  # "HTTP/1.1"
    headers: tuple[tuple[str, str], ...]  # as sent, in order

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def upstream_request(self) -> h11.Request:
        """The request as sent to its host: origin form, ``Host`` naming that host (RFC 9112
        7.2: a proxy replaces it), the hop's headers and those its ``Connection`` lists left out
        (never the framing), and ``Connection: close`` (see the relay's docstring)."""
        gone = dropped(self.headers) | {"host"}
        kept = [(k, v) for k, v in self.headers if k.lower() not in gone]
        pairs = [("Host", _authority_text(self.target)), *kept, ("Connection", "close")]
        # latin-1: a value's bytes as they came (obs-text included), never re-encoded otherwise
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs]
        return h11.Request(method=self.method, target=self.path, headers=headers)

    def forwarded(self) -> bytes:
        """:meth:`upstream_request` as bytes."""
        return h11.Connection(h11.CLIENT).send(self.upstream_request()) or b""


def dropped(headers: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> frozenset[str]:
    """The names of ``headers`` a hop does not send on: the hop-by-hop ones and those a
    ``Connection`` header lists, never the framing or the host."""
    named = {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}
    return HOP_BY_HOP | (frozenset(named) - KEPT)


class HeadParser:
    """A request head read from the bytes of a connection as they come. :meth:`feed` gives at
    most ``MAX_HEAD_BYTES`` to h11 before the head is whole (a longer head is refused, whatever
    the size of a read), the rest is kept in ``pending``; after the head, ``connection`` reads
    the body of a plain-HTTP request, and ``pending`` holds a tunnel's first bytes."""

    def __init__(self) -> None:
        self.connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.pending = b""
        self._fed = 0

    @property
    def started(self) -> bool:
        """Whether any byte came."""
        return self._fed > 0 or bool(self.pending)

    def feed(self, data: bytes) -> RequestHead | None:
        """The head, once whole (None: more bytes needed; ``b""`` says the client stopped sending).
        Raises RefusalError."""
        if not data:
            raise RefusalError(Refusal.BAD_REQUEST, "the client stopped before its head ended")
        data = self.pending + data
        take = data[: MAX_HEAD_BYTES - self._fed]
        self.pending = data[len(take) :]
        self._fed += len(take)
        try:
            self.connection.receive_data(take)
            event = self.connection.next_event()
        except h11.RemoteProtocolError as e:
            hint = Refusal.HEAD_TOO_LARGE if e.error_status_hint == 431 else Refusal.BAD_REQUEST
            raise RefusalError(_BY_STATUS.get(e.error_status_hint, hint), str(e)) from None
        if event is h11.NEED_DATA:
            if self._fed >= MAX_HEAD_BYTES:
                raise RefusalError(Refusal.HEAD_TOO_LARGE, "a head over 16 KiB")
            return None
        assert isinstance(event, h11.Request)  # a server's first event, if not an error
        head = _head(event)
        if head.tunnel:
            early, _ = self.connection.trailing_data
            self.pending = bytes(early) + self.pending
        return head


def parse_head(raw: bytes) -> RequestHead:
    """Read a whole request head (``raw`` ends with its blank line). Raises RefusalError."""
    head = HeadParser().feed(raw) if raw else None
    if head is None:
        raise RefusalError(Refusal.BAD_REQUEST, "an incomplete head")
    return head


def _head(request: h11.Request) -> RequestHead:
    version = request.http_version.decode("ascii")
    if version not in ("1.0", "1.1"):
        raise RefusalError(Refusal.BAD_REQUEST, "not an HTTP/1.x request")
    headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw_items())
    if any(_CONTROL.search(v) for _, v in request.headers.raw_items()):
        raise RefusalError(Refusal.BAD_REQUEST, "a control character in a header")
    names = {k.lower() for k, _ in headers}
    if {"content-length", "transfer-encoding"} <= names:
        raise RefusalError(Refusal.BAD_REQUEST, "both Content-Length and Transfer-Encoding")
    method = request.method.decode("ascii")
    target = request.target.decode("latin-1")
    if method == "CONNECT":
        return RequestHead(method, authority(target, None), True, "", f"HTTP/{version}", headers)
    endpoint, path = _absolute(target)
    return RequestHead(method, endpoint, False, path, f"HTTP/{version}", headers)


def authority(text: str, default_port: int | None) -> Endpoint:
    """``host:port`` or ``[v6]:port`` (the port may be left out where ``default_port`` is given):
    an endpoint with a host no resolver can misread. Raises RefusalError."""
    if text.startswith("["):
        close = text.find("]")
        host, rest = text[1:close], text[close + 1 :]
        if close < 0 or not _ip(host, 6):
            raise RefusalError(Refusal.BAD_REQUEST, "a bracketed host is an IPv6 address")
    else:
        host, sep, port = text.partition(":")
        rest = sep + port
    if rest:
        if not rest.startswith(":") or not _PORT.fullmatch(rest[1:]) or not 0 < int(rest[1:]) < 65536:
            raise RefusalError(Refusal.BAD_REQUEST, "a port is a number 1-65535")
        port_number = int(rest[1:])
    elif default_port is not None:
        port_number = default_port
    else:
        raise RefusalError(Refusal.BAD_REQUEST, "CONNECT needs host:port")
    if not text.startswith("[") and not (_ip(host, 4) or valid_name(host)):
        raise RefusalError(Refusal.BAD_REQUEST, "not a host name or an IP address")
    return Endpoint(host, port_number)


def valid_name(host: str) -> bool:
    """Whether ``host`` is a DNS name as the relay serves one: ASCII letters, digits, hyphens
    (and underscores) in labels of 1-63, 253 at most, its last label not a number (``127.1``
    would be read as an address), an optional trailing dot."""
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253 or not name.isascii():
        return False
    labels = name.lower().split(".")
    return all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def _ip(host: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(host).version == version
    except ValueError:
        return False


def _absolute(text: str) -> tuple[Endpoint, str]:
    """A plain-HTTP request's ``http://host[:port]/path?query``: its host and its origin form."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() != "http":
        # https:// in absolute form would make the relay the TLS client: it never is (CONNECT).
        raise RefusalError(Refusal.BAD_REQUEST, "a request through the relay is CONNECT or an absolute http:// URL")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    where, path = rest[:cut], rest[cut:].partition("#")[0]
    if "@" in where:
        raise RefusalError(Refusal.BAD_REQUEST, "a request target with user info")
    if not path.startswith("/"):
        path = "/" + path
    return authority(where, HTTP_PORT), path


def _authority_text(target: Endpoint) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    return host if target.port == HTTP_PORT else f"{host}:{target.port}"


def authorized(head: RequestHead, token: str) -> bool:
    """Whether the head carries ``Proxy-Authorization: Basic`` with ``token`` as its password
    (any user name), compared in constant time."""
    value = head.header("proxy-authorization") or ""
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    _, sep, password = decoded.partition(":")
    return bool(sep) and hmac.compare_digest(password.encode(), token.encode())
