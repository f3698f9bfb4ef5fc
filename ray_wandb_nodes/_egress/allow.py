"""Where the relay may tunnel to: the run's W&B host, the storage host its uploads go to, and
the hosts the user lists (pure).

An entry is a host and a port. A host is matched as a name, case-insensitively and without a
trailing dot, never resolved: the relay checks the name a client asks for, then connects to that
name, so a client cannot reach another address by naming an allowed one. A user's entry may be a
domain with a leading ``*.`` (``*.s3.amazonaws.com``), which matches its subdomains, never the
domain itself. An entry without a port allows 443 only, the port of every HTTPS upload URL. An
entry is read by ``_config.hosts`` (the option's check reads it with the same parser).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .._config.hosts import HTTP_PORT, HTTPS_PORT, Endpoint, endpoint_of, normal_host, parse_entry

__all__ = [
    "DEFAULT_BASE_URL", "HTTPS_PORT", "HTTP_PORT", "AllowList", "Endpoint", "allow_list", "endpoint_of",
    "normal_host", "parse_entry", "storage_endpoints",
]  # fmt: skip

# W&B's cloud: its API host, and the storage host its presigned upload URLs name.
WANDB_CLOUD = "api.wandb.ai"
WANDB_CLOUD_STORAGE = "storage.googleapis.com"
DEFAULT_BASE_URL = f"https://{WANDB_CLOUD}"


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
