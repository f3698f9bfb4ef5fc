"""Which proxy wandb's client sends a request through, as wandb-core decides it (pure).

wandb-core (``core/internal/clients/proxy.go``) takes the ``https_proxy`` setting for https
URLs and ``http_proxy`` for http ones; without it, Go's ``http.ProxyFromEnvironment``:
``HTTPS_PROXY`` / ``HTTP_PROXY`` (upper case first, then lower), skipped for ``localhost``, a
loopback address and the hosts ``NO_PROXY`` names. The reachability check asks the same question
so that it checks the way the writer's requests will take, not a way they never use.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .allow import endpoint_of, normal_host


def proxy_for(url: str, settings: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """The proxy URL a writer with ``settings``, in a process with ``environ``, sends requests
    to ``url`` through (None: straight to its host)."""
    scheme = urlsplit(url).scheme
    configured = settings.get(f"{scheme}_proxy")
    if configured:
        return str(configured)
    if scheme == "https":
        proxy = _env(environ, "HTTPS_PROXY")
    elif scheme == "http" and "REQUEST_METHOD" not in environ:  # Go ignores HTTP_PROXY under CGI
        proxy = _env(environ, "HTTP_PROXY")
    else:
        return None
    if not proxy:
        return None
    target = endpoint_of(url)
    if not _use_proxy(target.host, target.port, _env(environ, "NO_PROXY")):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"  # Go reads "host:port" as http://


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name) or environ.get(name.lower()) or ""


def _use_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Go's ``httpproxy`` rules: never for localhost or a loopback address; not for a host that
    ``NO_PROXY`` names (``*``; an address or a CIDR; ``example.com`` for it and its subdomains,
    ``.example.com`` and ``*.example.com`` for its subdomains; each with an optional port)."""
    ip = _ip(host)
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return False
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return False
        if "/" in entry and ip is not None:
            try:
                if ip in ipaddress.ip_network(entry, strict=False):
                    return False
            except ValueError:
                pass
            continue
        name, entry_port = _split_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        if _ip(name) is not None:
            if ip is not None and _ip(name) == ip:
                return False
            continue
        if name.startswith("*."):
            name = name[1:]
        if name.startswith("."):
            if host.endswith(name):
                return False
        elif host == name or host.endswith("." + name):
            return False
    return True


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6]:port
        host, _, rest = entry[1:].partition("]")
        return normal_host(host), int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return normal_host(host), int(port) if port.isdigit() else None
    return normal_host(entry), None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
