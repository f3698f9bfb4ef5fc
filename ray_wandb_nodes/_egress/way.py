"""Which way a node writer takes to W&B, found on its node before it joins: straight, through the
relay, or offline (brought into the run at its end). The values that cross between the fleet and
a node's logger, the finding (:func:`find_way`, bounded by the checks' deadlines) and what it
makes of the writer's spec (:func:`for_way`, pure).

The fleet hands every online writer a :class:`WriterEgress` (the relay's route when the run has
one); the node's logger checks the W&B host the way the writer's requests would go
(``proxy_for``: a site's proxy counts), and when that fails and a route is given, through the
relay; its answer (:class:`Egress`) rides the logger's status back to the fleet, which names the
nodes without a route in one warning and brings their offline runs into the run at its end.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .._wandb.writers import Role, WriterSpec
from .allow import DEFAULT_BASE_URL
from .proxies import proxy_for
from .reach import DEFAULT_TIMEOUT_S, Reachability, check_reach
from .route import RelayRoute, writer_settings

# What a writer does instead of W&B's own: an online writer's mode, and its proxies (a relayed one's).
_OFFLINE = "offline"
_PROXY_SETTINGS = ("https_proxy", "http_proxy")


class Way(enum.Enum):
    """How a node writer reaches W&B."""

    DIRECT = "direct"  # straight from its node (or through the site's proxy its environment names)
    RELAY = "relay"  # through the relay on the controller's node, live
    OFFLINE = "offline"  # written on its node; its run is brought into the W&B run at the end


@dataclass(frozen=True)
class WriterEgress:
    """What the fleet hands a node's logger with an online writer: the relay's route (None: the
    run has no relay) and the bound of each check."""

    route: RelayRoute | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Egress:
    """The way a writer found before it joined (plain data: it rides its logger's status)."""

    way: Way
    direct: Reachability  # the check of the W&B host, straight (or through the site's proxy)
    relayed: Reachability | None = None  # the check through the relay, where the direct one failed

    @property
    def seconds(self) -> float:
        """How long the checks took (what the writer's join waited for them)."""
        return self.direct.seconds + (self.relayed.seconds if self.relayed is not None else 0.0)

    def describe(self) -> str:
        """What the checks found, in one line: ``198.18.0.2:443 unreachable (Network is
        unreachable); through relay 10.0.0.1:40123 refused (...)``."""
        text = self.direct.describe()
        return f"{text}; {self.relayed.describe()}" if self.relayed is not None else text


def base_url_of(settings: Mapping[str, Any]) -> str:
    """The W&B host a writer with ``settings`` sends to (W&B's cloud when none is set)."""
    return str(settings.get("base_url") or DEFAULT_BASE_URL)


def online(spec: WriterSpec) -> bool:
    """Whether ``spec``'s writer sends to W&B (not an offline writer, not an observer)."""
    return spec.role in (Role.NODE, Role.RUN) and spec.settings.get("mode") != _OFFLINE


def find_way(
    spec: WriterSpec,
    egress: WriterEgress,
    environ: Mapping[str, str] | None = None,
    check: Callable[..., Reachability] | None = None,
) -> Egress:
    """Check, on this node, the way ``spec``'s writer would send to W&B; where it fails and the
    run has a relay, the way through it. At most two checks, each within ``egress.timeout_s``."""
    check = check or check_reach  # looked up at the call: tests put a scripted check there
    url = base_url_of(spec.settings)
    environ = os.environ if environ is None else environ
    direct = check(url, proxy=proxy_for(url, spec.settings, environ), timeout_s=egress.timeout_s)
    if direct.reachable:
        return Egress(Way.DIRECT, direct)
    if egress.route is None:
        return Egress(Way.OFFLINE, direct)
    relayed = check(url, proxy=egress.route.proxy_url(), timeout_s=egress.timeout_s)
    return Egress(Way.RELAY if relayed.reachable else Way.OFFLINE, direct, relayed)


def for_way(spec: WriterSpec, found: Egress, route: RelayRoute | None) -> WriterSpec:
    """``spec`` as its writer takes ``found``'s way: as it is (direct), with wandb's proxy
    settings naming the relay (in its process only: never a proxy variable), or offline (its run
    written on its node, under its label, to be synced into the run at the end)."""
    if found.way is Way.RELAY:
        if route is None:
            raise ValueError("a writer sent through the relay needs the relay's route")
        return replace(spec, settings={**spec.settings, **writer_settings(route)})
    if found.way is Way.OFFLINE:
        settings = {k: v for k, v in spec.settings.items() if k not in _PROXY_SETTINGS}
        return replace(spec, settings={**settings, "mode": _OFFLINE})
    return spec
