"""Does this node reach the run's W&B host? A short, bounded check a node writer runs before it
joins, its outcome a typed value.

The check takes the way the writer's requests will take (``proxy_for``): straight to the W&B
host, or through a proxy (a site's, or the relay). It resolves the name (where no proxy does),
opens a TCP connection, through a proxy asks for a tunnel (``CONNECT``, with the proxy URL's
credentials) or, for an ``http://`` server, sends one request in absolute form; for ``https``
it completes a TLS handshake and checks the certificate as the client will (the system's
roots, or ``SSL_CERT_FILE``). All of it within one deadline, ``timeout_s``: a node whose packets
are dropped costs that much, never the kernel's minutes of SYN retries.

What a reachable outcome proves: a route to the host (or to the proxy), a listener there, a
proxy that lets this client tunnel to it, and a TLS server with a certificate for that name that
this node trusts, at the moment of the check. What it cannot prove: that requests will be
answered (a proxy or filter that lets the tunnel open and drops what follows, a rate limit, a
wrong API key), that the storage host of the uploads is reachable too, or that the way stays
open for the run (a node cut off later is the client's retries' business).
"""

from __future__ import annotations

import base64
import enum
import errno
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .allow import Endpoint, endpoint_of

DEFAULT_TIMEOUT_S = 5.0
_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EPERM, errno.EINVAL}
_PROXY_HEAD_BYTES = 8192


class Reach(enum.Enum):
    """What the check found."""

    REACHABLE = "reachable"
    REFUSED = "refused"  # a reset at connect or in the handshake, or a proxy that said no
    TIMED_OUT = "timed out"  # no answer before the deadline: packets dropped, a stalled resolver or proxy
    UNREACHABLE = "unreachable"  # no route, a prohibiting route, a name that does not resolve
    UNTRUSTED = "untrusted"  # a TLS server answered with a certificate this node does not trust


@dataclass(frozen=True)
class Reachability:
    """The outcome of one check (plain data: it crosses from a node's logger to the fleet)."""

    outcome: Reach
    target: Endpoint  # the W&B host and port
    via: str | None  # the proxy's host:port, without credentials; None: direct
    error: str  # what failed, in the OS's or the proxy's words ("" when reachable)
    seconds: float

    @property
    def reachable(self) -> bool:
        return self.outcome is Reach.REACHABLE

    def describe(self) -> str:
        """One line: ``api.wandb.ai:443 unreachable (Network is unreachable)``."""
        via = f" through {self.via}" if self.via else ""
        why = f" ({self.error})" if self.error else ""
        return f"{self.target}{via} {self.outcome.value}{why}"


class _Found(Exception):  # noqa: N818 - not an error: how a step says what it found
    def __init__(self, outcome: Reach, error: str) -> None:
        super().__init__(error)
        self.outcome, self.error = outcome, error


def check_reach(
    url: str, *, proxy: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, context: ssl.SSLContext | None = None
) -> Reachability:
    """Check, within ``timeout_s``, that ``url``'s host is reached directly or through ``proxy``
    (an ``http://[user:password@]host:port`` URL). ``context``: the TLS context to verify with
    (default: the system's, as ``ssl.create_default_context()``)."""
    target = endpoint_of(url)
    tls = urlsplit(url).scheme == "https"
    hop = endpoint_of(proxy) if proxy else target
    started = time.monotonic()
    deadline = started + timeout_s
    outcome, error = Reach.REACHABLE, ""
    try:
        sock = _connect(hop, deadline, "the proxy" if proxy else "")
        try:
            if proxy:
                _through_proxy(sock, target, proxy, tls, deadline)
            if tls:
                _handshake(sock, target, context or ssl.create_default_context(), deadline)
        finally:
            sock.close()
    except _Found as found:
        outcome, error = found.outcome, found.error
    return Reachability(outcome, target, str(hop) if proxy else None, error, time.monotonic() - started)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Found(Reach.TIMED_OUT, "no answer before the deadline")
    return left


def _resolve(hop: Endpoint, deadline: float) -> list[Any]:
    """The addresses of ``hop``; the resolver on a thread, waited for until the deadline (a node
    whose DNS server is unreachable blocks ``getaddrinfo`` for its own timeouts, 5 s a try)."""
    box: list[Any] = []

    def resolve() -> None:
        try:
            box.append(socket.getaddrinfo(hop.host, hop.port, type=socket.SOCK_STREAM))
        except OSError as e:
            box.append(e)

    thread = threading.Thread(target=resolve, name="ray_wandb_nodes-resolve", daemon=True)
    thread.start()
    thread.join(_left(deadline))
    if not box:
        raise _Found(Reach.TIMED_OUT, f"resolving {hop.host} took longer than the check")
    if isinstance(box[0], OSError):
        raise _Found(Reach.UNREACHABLE, f"{hop.host} does not resolve: {_words(box[0])}")
    return list(box[0])


def _connect(hop: Endpoint, deadline: float, what: str) -> socket.socket:
    """A TCP connection to the first of ``hop``'s addresses that takes one."""
    last: _Found | None = None
    for family, kind, proto, _, address in _resolve(hop, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            raise _Found(Reach.TIMED_OUT, _of(what, "no answer to the connection (packets dropped?)")) from None
        except ConnectionRefusedError as e:
            last = _Found(Reach.REFUSED, _of(what, _words(e)))
        except OSError as e:
            outcome = Reach.UNREACHABLE if e.errno in _UNREACHABLE_ERRNOS else Reach.REFUSED
            last = _Found(outcome, _of(what, _words(e)))
        except _Found:
            sock.close()
            raise
        sock.close()
    raise last or _Found(Reach.UNREACHABLE, _of(what, f"{hop.host} has no address"))


def _through_proxy(sock: socket.socket, target: Endpoint, proxy: str, tls: bool, deadline: float) -> None:
    """Ask the proxy for the way to ``target``: a tunnel (https), or one plain request (http)."""
    parts = urlsplit(proxy)
    auth = ""
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = f"Proxy-Authorization: Basic {base64.b64encode(pair.encode()).decode()}\r\n"
    host = f"[{target.host}]" if ":" in target.host else target.host
    if tls:
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"
    else:
        where = f"{host}:{target.port}"
        head = f"HEAD http://{where}/ HTTP/1.1\r\nHost: {where}\r\n{auth}Connection: close\r\n\r\n"
    try:
        sock.settimeout(_left(deadline))
        sock.sendall(head.encode("latin-1"))
        status = _status_of(_read_head(sock, deadline))
    except TimeoutError:
        raise _Found(Reach.TIMED_OUT, "the proxy did not answer") from None
    except OSError as e:
        raise _Found(Reach.REFUSED, f"the proxy: {_words(e)}") from None
    code = int(status.split(" ")[1]) if len(status.split(" ")) > 1 and status.split(" ")[1].isdigit() else 0
    if tls and 200 <= code < 300:
        return
    proxy_says = {502: Reach.UNREACHABLE, 503: Reach.UNREACHABLE, 504: Reach.TIMED_OUT}
    if not tls and code and code not in (403, 407, *proxy_says):
        return  # the server's own answer, whatever it says: the way is open
    raise _Found(proxy_says.get(code, Reach.REFUSED), f"the proxy answered {status!r}")


def _read_head(sock: socket.socket, deadline: float) -> bytes:
    """The proxy's answer up to its blank line, a byte at a time: nothing of the tunnel after it
    may be taken from the socket."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        sock.settimeout(_left(deadline))
        byte = sock.recv(1)
        if not byte:
            raise _Found(Reach.REFUSED, "the proxy closed the connection")
        head += byte
        if len(head) > _PROXY_HEAD_BYTES:
            raise _Found(Reach.REFUSED, "the proxy's answer is not HTTP")
    return head


def _status_of(head: bytes) -> str:
    return head.split(b"\r\n", 1)[0].decode("latin-1")


def _handshake(sock: socket.socket, target: Endpoint, context: ssl.SSLContext, deadline: float) -> None:
    try:
        sock.settimeout(_left(deadline))
        # The handshake (done on wrapping) is the whole check; the connection closes after it.
        context.wrap_socket(sock, server_hostname=target.host).close()
    except ssl.SSLCertVerificationError as e:
        raise _Found(Reach.UNTRUSTED, f"TLS: {e.verify_message or e.reason}") from None
    except TimeoutError:
        raise _Found(Reach.TIMED_OUT, "the TLS handshake did not finish") from None
    except ssl.SSLError as e:
        raise _Found(Reach.REFUSED, f"TLS: {e.reason or e}") from None
    except OSError as e:
        raise _Found(Reach.REFUSED, f"TLS: {_words(e)}") from None


def _of(what: str, words: str) -> str:
    return f"{what}: {words}" if what else words


def _words(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__
