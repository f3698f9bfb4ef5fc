"""What a node writer gets to send through the relay: wandb's proxy settings and their
environment form, for the writer's process only (pure).

wandb's client takes a proxy per process: the ``https_proxy`` and ``http_proxy`` settings (or
``WANDB_HTTPS_PROXY`` and ``WANDB_HTTP_PROXY``, read when the process's wandb is set up), and
wandb-core sends every request of that process through it, file_stream, GraphQL and uploads
alike. The user info of the proxy URL becomes ``Proxy-Authorization: Basic``: the relay's token
rides there. Nothing here is ever ``HTTP_PROXY``, ``https_proxy`` or ``grpc_proxy``: Ray's
processes read those (its gRPC breaks with a proxy), and a writer runs in a Ray worker process.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from .._config.secrets import Secret

PROXY_USER = "relay"
# The variables through which a proxy reaches Ray's own gRPC and HTTP clients (gRPC's core reads
# grpc_proxy, https_proxy and http_proxy; Python's and Go's clients read the http(s)/all ones),
# in either case. A writer's process must never get one from the relay.
RAY_PROXY_VARIABLES = frozenset({"http_proxy", "https_proxy", "all_proxy", "grpc_proxy"})


@dataclass(frozen=True)
class RelayRoute:
    """Where a node writer finds the relay: its cluster-internal address, its port and the run's
    token; picklable, and its token never shows in a repr."""

    host: str
    port: int
    token: Secret

    def proxy_url(self) -> str:
        """``http://relay:<token>@host:port``: the hop to the relay is plain TCP inside the cluster,
        the TLS of an HTTPS request goes through it end to end (CONNECT)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{PROXY_USER}:{self.token.reveal()}@{host}:{self.port}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"relay {host}:{self.port}"


def new_token() -> Secret:
    """A run's relay token: 256 random bits, URL-safe (it stands in a proxy URL as it is)."""
    return Secret(secrets.token_urlsafe(32))


def writer_settings(route: RelayRoute) -> dict[str, str]:
    """The ``wandb.Settings`` fields that send a writer's every request through the relay."""
    url = route.proxy_url()
    return {"https_proxy": url, "http_proxy": url}


def writer_environment(route: RelayRoute) -> dict[str, str]:
    """The same as environment variables, for a writer's process before its wandb is set up."""
    url = route.proxy_url()
    return {"WANDB_HTTPS_PROXY": url, "WANDB_HTTP_PROXY": url}


def ray_proxy_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that would put a proxy in front of Ray's own connections."""
    return {k: v for k, v in environ.items() if k.lower() in RAY_PROXY_VARIABLES}
