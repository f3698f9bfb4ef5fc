"""The relay's reading of a client's request head and the answers it gives (pure).

A client asks for a tunnel with ``CONNECT host:port`` (HTTPS: the relay then copies bytes it
cannot read), or sends a plain-HTTP request in absolute form, ``POST http://host:port/path``
(a W&B server without TLS). The head is read once per connection: everything after it goes to
the one host the head named, which the relay checked, so a second request on the connection
cannot reach another host.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hmac
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .allow import HTTP_PORT, Endpoint

MAX_HEAD_BYTES = 16 * 1024
# Headers of the hop from the client to the relay, never sent on: the relay's own credentials,
# and what would keep a connection open or change its protocol (each request gets a connection).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "upgrade", "expect"}
)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110's token: a method, a header name


class Refusal(enum.Enum):
    """Why the relay said no: the HTTP status it answers, and the words of its status line."""

    BAD_REQUEST = (400, "Bad Request")
    NOT_ALLOWED = (403, "Forbidden")
    AUTH = (407, "Proxy Authentication Required")
    HEAD_TIMEOUT = (408, "Request Timeout")
    HEAD_TOO_LARGE = (431, "Request Header Fields Too Large")
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


class RefusalError(ValueError):
    """A head the relay will not serve, and the answer it gets."""

    def __init__(self, refusal: Refusal, why: str) -> None:
        super().__init__(why)
        self.refusal = refusal


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

    def forwarded(self) -> bytes:
        """The request as sent to its host: origin form, the hop's headers left out, and
        ``Connection: close`` (the answer ends the connection; see the relay's docstring)."""
        named = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        lines = [f"{self.method} {self.path} {self.version}"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() not in HOP_BY_HOP and k.lower() not in named]
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> RequestHead:
    """Read a request head (``raw`` ends with its blank line). Raises RefusalError."""
    lines = raw.decode("latin-1").split("\r\n")  # latin-1: every byte decodes
    while lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise RefusalError(Refusal.BAD_REQUEST, "empty head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise RefusalError(Refusal.BAD_REQUEST, "not an HTTP/1.x request line")
    method, target_text, version = parts
    headers = tuple(_header(line) for line in lines[1:])
    if method == "CONNECT":
        return RequestHead(method, _authority(target_text), True, "", version, headers)
    target, path = _absolute(target_text)
    return RequestHead(method, target, False, path, version, headers)


def _header(line: str) -> tuple[str, str]:
    name, sep, value = line.partition(":")
    if not sep or not _TOKEN.match(name):  # also a folded line (leading space) and a space before ':'
        raise RefusalError(Refusal.BAD_REQUEST, "a malformed header line")
    return name, value.strip()


def _authority(text: str) -> Endpoint:
    """CONNECT's ``host:port`` (``[v6]:port``)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RefusalError(Refusal.BAD_REQUEST, "CONNECT needs host:port")
    if host.startswith("[") != host.endswith("]") or "@" in host:
        raise RefusalError(Refusal.BAD_REQUEST, "CONNECT needs host:port")
    return Endpoint(host, int(port))


def _absolute(text: str) -> tuple[Endpoint, str]:
    """A plain-HTTP request's ``http://host[:port]/path?query``: its host and its origin form."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:
        raise RefusalError(Refusal.BAD_REQUEST, "a malformed request target") from e
    if parts.scheme != "http" or not parts.hostname or parts.username is not None:
        # https:// in absolute form would make the relay the TLS client: it never is (CONNECT).
        raise RefusalError(Refusal.BAD_REQUEST, "a request through the relay is CONNECT or an absolute http:// URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Endpoint(parts.hostname, port or HTTP_PORT), path


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


def close_response_head(raw: bytes) -> bytes:
    """An upstream answer's head with ``Connection: close`` in place of its own: the client
    opens a new connection for its next request instead of finding this one closed under it."""
    lines = raw.decode("latin-1").split("\r\n")
    while lines and lines[-1] == "":
        lines.pop()
    kept = [lines[0]] + [line for line in lines[1:] if line.partition(":")[0].strip().lower() != "connection"]
    return ("\r\n".join([*kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")


def interim(raw: bytes) -> bool:
    """Whether an answer's head is an interim one (1xx), which a final head follows."""
    parts = raw[:16].split(b" ", 2)
    return len(parts) >= 2 and parts[1].startswith(b"1") and parts[1] != b"101"
