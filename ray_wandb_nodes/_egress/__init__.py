"""Egress: how node writers reach W&B where a node has no route of its own.

Before a node writer joins the run it checks that it reaches the run's W&B host
(``reach.check_reach``, the way ``proxies.proxy_for`` says its requests go). A node that does not
writes offline and is brought into the run at its end (the default), or, with the relay option,
sends through a relay on the Train controller's node (``relay.Relay``, run by ``actor.RelayOnNode``
in a small actor there): a forward proxy that tunnels only to the run's W&B and storage hosts
(``allow``), only for holders of the run's token, and never decrypts TLS. A writer reaches it
through wandb's own proxy settings, in its process only (``route``). ``way`` is what the fleet and
a node's logger exchange about it: the route handed to a writer (``WriterEgress``), the way the
writer found (``Egress``: direct, relay or offline), and the writer's spec for that way.

Imports nothing of Ray or wandb at module level: the relay and the check run in any process.
"""

from __future__ import annotations

from .actor import RelayActor, RelayOnNode
from .allow import AllowList, Endpoint, allow_list, endpoint_of, parse_entry
from .proxies import proxy_for
from .reach import DEFAULT_TIMEOUT_S, Reach, Reachability, check_reach
from .relay import Relay, RelayConfig, RelayStats
from .route import (
    RAY_PROXY_VARIABLES,
    RelayRoute,
    new_token,
    ray_proxy_variables,
    writer_environment,
    writer_settings,
)
from .runner import RelayThread
from .way import Egress, Way, WriterEgress, base_url_of, find_way, for_way, online

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RAY_PROXY_VARIABLES",
    "AllowList",
    "Egress",
    "Endpoint",
    "Reach",
    "Reachability",
    "Relay",
    "RelayActor",
    "RelayConfig",
    "RelayOnNode",
    "RelayRoute",
    "RelayStats",
    "RelayThread",
    "Way",
    "WriterEgress",
    "allow_list",
    "base_url_of",
    "check_reach",
    "endpoint_of",
    "find_way",
    "for_way",
    "new_token",
    "online",
    "parse_entry",
    "proxy_for",
    "ray_proxy_variables",
    "writer_environment",
    "writer_settings",
]
