"""Where the relay may tunnel to: the run's W&B host, the storage host its uploads go to, and
the hosts the user lists (pure).

An entry is a host and a port. A host is matched as a name, case-insensitively and without a
trailing dot: the relay checks the name a client asks for, then resolves that name (fully
qualified) and connects to the addresses it got, so a client cannot reach another host by naming
an allowed one. Where an allowed name resolves to an address of the relay's own node or link
(loopback, link-local, a cloud's metadata service: :func:`special`), the relay connects only
where the list names that address itself (with the port), or the name is the run's W&B host (``api``). A user's
entry may be a domain with a leading ``*.`` (``*.storage.example.com``), which matches its
subdomains, never the domain itself; the Public Suffix List judges which domains may have one
(``_config.hosts``). An entry without a port allows 443 only, the port of every HTTPS upload
URL. An entry is read by ``_config.hosts`` (the option's check reads it with the same parser).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from .._config.hosts import HTTP_PORT, HTTPS_PORT, Endpoint, any_owner, endpoint_of, normal_host, parse_entry

__all__ = [
    "DEFAULT_BASE_URL", "HTTPS_PORT", "HTTP_PORT", "AllowList", "Endpoint", "allow_list", "endpoint_of",
    "normal_host", "parse_entry", "special", "storage_endpoints",
]  # fmt: skip

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
# Cloud metadata services outside the link-local ranges (those are refused as link-local):
# Alibaba's, Azure's wire server, AWS's over IPv6.
METADATA = frozenset(ipaddress.ip_address(a) for a in ("100.100.100.200", "168.63.129.16", "fd00:ec2::254"))


def special(address: IP) -> bool:
    """Whether ``address`` is the node's own, its link's, or a metadata service's."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast
        or address in METADATA
    )  # fmt: skip


# W&B's cloud: its API host, and the storage host its presigned upload URLs name.
WANDB_CLOUD = "api.wandb.ai"
WANDB_CLOUD_STORAGE = "storage.googleapis.com"
DEFAULT_BASE_URL = f"https://{WANDB_CLOUD}"


@dataclass(frozen=True)
class AllowList:
    """The endpoints a relay tunnels to; ``suffixes`` are ``(".domain", port)`` of ``*.`` entries."""

    endpoints: frozenset[Endpoint]
    suffixes: frozenset[tuple[str, int]] = frozenset()
    api: Endpoint | None = None  # the run's W&B host

    def allows(self, target: Endpoint) -> bool:
        if target in self.endpoints:
            return True
        return any(target.port == port and target.host.endswith(suffix) for suffix, port in self.suffixes)

    def may_reach(self, target: Endpoint, address: IP) -> bool:
        """Whether the relay connects to ``address``, which the allowed ``target`` resolved to."""
        if not special(address) or target == self.api:
            return True
        return Endpoint(str(address), target.port) in self.endpoints

    def any_owner(self) -> list[str]:
        """The entries that reach hosts of any owner (a provider's shared names, as any bucket of
        ``*.s3.amazonaws.com``), as written, sorted."""
        named = [str(e) for e in self.endpoints if e != self.api and any_owner(e.host)]
        return sorted(named + [f"*{s}:{p}" for s, p in self.suffixes if any_owner(s)])

    def describe(self) -> list[str]:
        """Every entry as written: ``host:port`` and ``*.domain:port``, sorted."""
        return sorted([str(e) for e in self.endpoints] + [f"*{s}:{p}" for s, p in self.suffixes])


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
    return AllowList(frozenset(endpoints), frozenset(suffixes), endpoint_of(base))
