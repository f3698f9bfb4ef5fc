"""The relay's connection to an allowed host: straight, or through the site's proxy.

**Straight.** The name is resolved fully qualified (``api.wandb.ai.``: no search domain of the
node's resolver is tried after it), and the relay connects to the addresses it got, never to the
name again (the answer it checked is the one it uses). glibc does not match a fully qualified
name against ``/etc/hosts``, so where that finds nothing, a name the node's hosts file lists, or
a name of one label (which only a search domain or the hosts file completes: the user listed it
so), is resolved as written. An address of the node itself or of its
link (loopback, link-local, unspecified, multicast) or a cloud's metadata service is refused unless
the allow-list names that address as such, or the name is the run's own W&B host (the primary
writes there): an allowed name that a DNS record points at ``169.254.169.254`` reaches nothing.

**Through the site's proxy.** Where the controller's process was given ``HTTPS_PROXY`` (for a
tunnel) or ``HTTP_PROXY`` (for a plain-HTTP request), and ``NO_PROXY`` does not name the host, as
wandb's client would decide it (``proxies.proxy_for``), the relay asks that proxy for a tunnel to
the host (``CONNECT``, with the proxy URL's credentials) and copies through it: the site's proxy
then resolves the name and applies its own policy.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from .allow import AllowList, Endpoint, endpoint_of
from .heads import Refusal, RefusalError
from .proxies import proxy_for

_LIMIT = 64 * 1024
_PROXY_HEAD_BYTES = 16 * 1024


def fully_qualified(host: str) -> str:
    """A name with its trailing dot (an address as it is)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host + "."


def hosts_file(path: str = "/etc/hosts") -> set[str]:
    """The names the node's hosts file lists, lower case (none where it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return set()
    return {name.lower().rstrip(".") for line in lines for name in line.partition("#")[0].split()[1:]}


def site_proxy(target: Endpoint, tunnel: bool, environ: Mapping[str, str]) -> str | None:
    """The site's proxy the relay goes through to ``target`` (None: straight)."""
    scheme = "https" if tunnel else "http"
    host = f"[{target.host}]" if ":" in target.host else target.host
    return proxy_for(f"{scheme}://{host}:{target.port}", {}, environ)


async def open_upstream(
    target: Endpoint, allow: AllowList, proxy: str | None, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``target`` within ``timeout_s``. Raises RefusalError."""
    try:
        return await asyncio.wait_for(_open(target, allow, proxy), timeout_s)
    except asyncio.TimeoutError:
        raise RefusalError(Refusal.UPSTREAM_TIMEOUT, "no answer from the host") from None
    except (OSError, UnicodeError) as e:  # UnicodeError: a name the resolver's IDNA codec refuses
        raise RefusalError(Refusal.UPSTREAM_FAILED, getattr(e, "strerror", None) or type(e).__name__) from None


async def _open(
    target: Endpoint, allow: AllowList, proxy: str | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if proxy is not None:
        return await _through(proxy, target)
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(fully_qualified(target.host), target.port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        if "." in target.host and target.host not in hosts_file():
            raise
        found = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    addresses = [(family, str(address[0])) for family, _, _, _, address in found]
    usable = [(f, a) for f, a in addresses if allow.may_reach(target, ipaddress.ip_address(a.partition("%")[0]))]
    if addresses and not usable:
        raise RefusalError(Refusal.NOT_ALLOWED, "it resolves to a loopback, link-local or metadata address")
    last: OSError = OSError("no address")
    for family, address in dict.fromkeys(usable):
        try:
            return await asyncio.open_connection(address, target.port, family=family, limit=_LIMIT)
        except OSError as e:
            last = e
    raise last


async def _through(proxy: str, target: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A tunnel to ``target`` through the site's ``proxy``; its answer's head read off."""
    hop = endpoint_of(proxy)
    reader, writer = await asyncio.open_connection(hop.host, hop.port, limit=_LIMIT)
    parts = urlsplit(proxy)
    auth = ""
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = f"Proxy-Authorization: Basic {base64.b64encode(pair.encode()).decode()}\r\n"
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode("latin-1"))
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        raise RefusalError(Refusal.UPSTREAM_FAILED, "the site's proxy did not answer in HTTP") from None
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status) < 2 or not status[1].startswith(b"2"):
        writer.close()
        raise RefusalError(Refusal.UPSTREAM_FAILED, f"the site's proxy answered {b' '.join(status[1:2])!r}")
    return reader, writer
