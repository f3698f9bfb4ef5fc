"""Hosts as a user and a client name them: an endpoint (a host and a TCP port), a URL's endpoint,
and an entry of ``egress_hosts`` (pure).

The relay's allow-list (``_egress.allow``) is made of these; the option's check reads an entry
with the same parser, so that an entry the callback accepts is one the relay understands.

A wildcard (``*.domain``) is judged by the Public Suffix List (the ``publicsuffixlist`` package,
which ships the list): its domain must lie below a registrable domain, as ICANN's part of the
list has them. ``*.co.uk`` (a public suffix) and ``*.amazonaws.com`` or ``*.example.com`` (a
whole registrable domain, every host of its owner, and of its owner's customers) are refused;
``*.storage.example.com`` and ``*.s3.amazonaws.com`` are taken. The list's private part (a
provider's names under which each name is another owner's, as ``s3.amazonaws.com``'s buckets)
says which entries reach any owner's hosts (:func:`any_owner`): a warning names those.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

HTTPS_PORT, HTTP_PORT = 443, 80
_PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: "²" is a digit to str.isdigit()


@dataclass(frozen=True, order=True)
class Endpoint:
    """A host name (or an IP address) and a TCP port, as a client names them."""

    host: str
    port: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "host", normal_host(self.host))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def normal_host(host: str) -> str:
    """A host as compared: lower case, no trailing dot, an IPv6 address without brackets and in
    its compressed form."""
    host = host.strip().strip("[]").rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def endpoint_of(url: str) -> Endpoint:
    """The host and port a URL's requests go to (the scheme's port when none is given)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return Endpoint(parts.hostname, parts.port or (HTTPS_PORT if parts.scheme == "https" else HTTP_PORT))


def parse_entry(entry: str) -> Endpoint | tuple[str, int]:
    """A user's allow-list entry: ``host``, ``host:port``, ``[v6]:port``, or ``*.domain[:port]``
    (returned as ``(".domain", port)``). An entry without a port means 443, the port of every
    HTTPS upload URL. Raises ValueError on anything else."""
    text = entry.strip()
    if not text or "/" in text or "@" in text:
        raise ValueError(f"{entry!r} is not a host or host:port")
    host, port = text, HTTPS_PORT
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"{entry!r}: an IPv6 address needs its closing ']'")
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{entry!r} is not [address]:port")
            port = _port(rest[1:], entry)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        port = _port(port_text, entry)
    if host.startswith("*."):
        domain = normal_host(host[1:])
        if "*" in domain or " " in domain or not domain.strip("."):
            raise ValueError(f"{entry!r} is not a host or host:port")
        registrable = _suffixes(icann=True).privatesuffix(domain.strip("."))
        if registrable is None:
            raise ValueError(f"{entry!r}: {domain[1:]} is a public suffix; a wildcard there opens every domain of it")
        if registrable == domain.strip("."):
            raise ValueError(
                f"{entry!r}: a wildcard over the whole domain {registrable} reaches every host of it and of its "
                f"customers; name the hosts, or a wildcard under a subdomain (*.storage.{registrable})"
            )
        return domain, port
    if not host or "*" in host or " " in host:
        raise ValueError(f"{entry!r} is not a host or host:port")
    return Endpoint(host, port)


def any_owner(host: str) -> bool:
    """Whether ``host`` (for a wildcard, ``.domain``) names hosts of any owner: it is, or lies
    under, a public suffix of the list's private part (``s3.amazonaws.com``: any bucket)."""
    name = host.strip(".")
    suffixes = _suffixes(icann=False)
    return bool(name) and (suffixes.is_public(name) or (host.startswith(".") and suffixes.privatesuffix(name) is None))


@functools.lru_cache(maxsize=2)
def _suffixes(*, icann: bool) -> Any:
    """The Public Suffix List as the package ships it (read once: about 0.2 s)."""
    from publicsuffixlist import PublicSuffixList

    return PublicSuffixList(only_icann=icann)


def _port(text: str, entry: str) -> int:
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        raise ValueError(f"{entry!r}: the port must be 1-65535")
    return int(text)
