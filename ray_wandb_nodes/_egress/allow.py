"""Where the relay may tunnel to: the run's W&B host, the storage host its uploads go to, and
the hosts the user lists (pure).

An entry is a host and a port. A host is matched as a name, case-insensitively and without a
trailing dot, never resolved: the relay checks the name a client asks for, then connects to that
name, so a client cannot reach another address by naming an allowed one. A user's entry may be a
domain with a leading ``*.`` (``*.s3.amazonaws.com``), which matches its subdomains, never the
domain itself. An entry without a port allows 443 only, the port of every HTTPS upload URL.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

# W&B's cloud: its API host, and the storage host its presigned upload URLs name.
WANDB_CLOUD = "api.wandb.ai"
WANDB_CLOUD_STORAGE = "storage.googleapis.com"
DEFAULT_BASE_URL = f"https://{WANDB_CLOUD}"
HTTPS_PORT, HTTP_PORT = 443, 80


@dataclass(frozen=True, order=True)
class Endpoint:
    """A host name (or an IP address) and a TCP port, as a client names them."""

    host: str
    port: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "host", normal_host(self.host))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class AllowList:
    """The endpoints a relay tunnels to; ``suffixes`` are ``(".domain", port)`` of ``*.`` entries."""

    endpoints: frozenset[Endpoint]
    suffixes: frozenset[tuple[str, int]] = frozenset()

    def allows(self, target: Endpoint) -> bool:
        if target in self.endpoints:
            return True
        return any(target.port == port and target.host.endswith(suffix) for suffix, port in self.suffixes)

    def describe(self) -> list[str]:
        """Every entry as written: ``host:port`` and ``*.domain:port``, sorted."""
        return sorted([str(e) for e in self.endpoints] + [f"*{s}:{p}" for s, p in self.suffixes])


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
    (returned as ``(".domain", port)``). Raises ValueError on anything else."""
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
        if domain.count(".") < 2:  # "*.com" would open a whole top-level domain
            raise ValueError(f"{entry!r}: a wildcard needs a domain of two labels at least (*.example.com)")
        return domain, port
    if not host or "*" in host or " " in host:
        raise ValueError(f"{entry!r} is not a host or host:port")
    return Endpoint(host, port)


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{entry!r}: the port must be 1-65535")
    return int(text)


def storage_endpoints(base_url: str) -> set[Endpoint]:
    """The storage host a W&B server's upload URLs name, where it is known: W&B's cloud puts them
    on Google Cloud Storage; a self-managed server on its own host (where its bucket is elsewhere,
    the user lists that host)."""
    api = endpoint_of(base_url)
    if api.host == WANDB_CLOUD:
        return {Endpoint(WANDB_CLOUD_STORAGE, HTTPS_PORT)}
    return set()


def allow_list(base_url: str | None, extra: Iterable[str] = ()) -> AllowList:
    """The run's W&B host (``base_url``; None: W&B's cloud), its storage host, and ``extra``."""
    base = base_url or DEFAULT_BASE_URL
    endpoints = {endpoint_of(base), *storage_endpoints(base)}
    suffixes: set[tuple[str, int]] = set()
    for entry in extra:
        parsed = parse_entry(entry)
        if isinstance(parsed, Endpoint):
            endpoints.add(parsed)
        else:
            suffixes.add(parsed)
    return AllowList(frozenset(endpoints), frozenset(suffixes))
