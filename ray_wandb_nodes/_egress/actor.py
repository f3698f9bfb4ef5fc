"""The relay as a small Ray actor on the Train controller's node (or the Tune driver's).

**Why an actor, not a thread of the controller.** The controller's process is the one that must
never stall or die: its event loop runs Train, and the plugin's hooks already share its GIL with
the primary writer and the fleet thread. A relay there would add, at 1,000 node writers, some
thousands of sockets (two a connection: the process's descriptor limit, Ray's to set, would have
to be raised for it), a Python callback for every chunk of every writer's traffic on the same
GIL as Train's loop, and its buffers in the controller's memory; a bug or an overload in it would
be the controller's. In an actor of its own (``num_cpus=0``, as the node loggers; pinned to the
controller's node by ``NodeAffinitySchedulingStrategy``, since that node reaches W&B: the primary
writes from there) the relay has its own process, GIL, descriptor limit (raised here for its
``max_connections``) and memory, and costs one idle Ray worker (about 120 MiB, see
``bench/footprint.py``). What dies with what: the actor is owned by the process that made it
(the controller), so Ray ends it when that process ends, a crash included; the run's end stops it
first (``RelayOnNode.stop``).

**Should the relay's process die mid-run** it is not restarted: a restart would bind the port
again after a window in which another process could take it (and with it the token, and an
``http://`` server's key, from the writers that retry there). The relay binds a port the kernel
chooses as it binds (no window), and the fleet watches it (:meth:`RelayOnNode.gone`, a call that
answers only when the actor ends): the writers that sent through it keep writing on their nodes
and are brought into the run at its end, as a node without a route is.

**Who may connect**: the addresses of the cluster's nodes, as Ray's node table has them
(:func:`cluster_addresses`, asked again when an unknown peer connects). **Where it goes**:
through the site's proxy where the driver's process had ``HTTPS_PROXY`` (``HTTP_PROXY``,
``NO_PROXY``), passed in its config, never in its environment (Ray's processes must not see one).
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from .._config.secrets import Secret
from .allow import allow_list
from .relay import RelayConfig, RelayStats
from .route import RelayRoute, new_token
from .runner import RelayThread

log = logging.getLogger(__name__)
_DESCRIPTORS_SPARE = 256
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy")


class RelayActor:
    """The actor's class (made remote by :class:`RelayOnNode`): one relay thread in its process."""

    def __init__(self, config: RelayConfig) -> None:
        self._relay = RelayThread(fit_descriptors(config))
        self._relay.start()
        self._stopped = threading.Event()

    def address(self) -> tuple[str, int]:
        assert self._relay.address is not None
        return self._relay.address

    def stats(self) -> RelayStats:
        return self._relay.stats()

    def watch(self) -> None:
        """Answers once the relay stopped (a caller learns of the actor's death by its error)."""
        self._stopped.wait()

    def stop(self) -> RelayStats:
        try:
            return self._relay.stop()
        finally:
            self._stopped.set()


def fit_descriptors(config: RelayConfig) -> RelayConfig:
    """``config`` within this process's descriptor limit: the soft limit raised towards what its
    bounds need (two a token holder, one a connection before its token), and where the hard limit
    is lower, ``max_connections`` cut to fit, with a warning (never a relay that accepts more than
    it can open upstream)."""
    wanted = 2 * config.max_connections + config.unauthenticated_total + _DESCRIPTORS_SPARE
    limit = raise_descriptor_limit(wanted)
    if limit >= wanted:
        return config
    room = max(2, limit - _DESCRIPTORS_SPARE)
    total = min(config.unauthenticated_total, max(1, room // 4))
    fitted = replace(
        config,
        max_connections=max(1, (room - total) // 2),
        unauthenticated_total=total,
        unauthenticated_per_peer=min(config.unauthenticated_per_peer, total),
    )
    log.warning(
        "relay: this process may open %d files (its hard limit): %d writers' connections at once, not %d",
        limit, fitted.max_connections, config.max_connections,
    )  # fmt: skip
    return fitted


def cluster_addresses() -> list[str]:
    """The addresses of the cluster's live nodes, as Ray's node table has them (the relay's peers)."""
    import ray

    return [str(n["NodeManagerAddress"]) for n in ray.nodes() if n.get("Alive") and n.get("NodeManagerAddress")]


def proxy_environment(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, Secret], ...]:
    """The site's proxy variables of ``environ`` (default: this process's), for the relay's config."""
    environ = os.environ if environ is None else environ
    return tuple((k, Secret(environ[k])) for k in PROXY_VARIABLES if environ.get(k))


def raise_descriptor_limit(wanted: int) -> int:
    """This process's soft limit of open files raised towards ``wanted`` (never above the hard
    limit, never lowered); the limit it has now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


class RelayOnNode:
    """The relay's actor as the driver side sees it: started on this process's node, its route
    once it answers, stopped with the run. Call it from a background thread (the fleet's), never
    from a hook: :meth:`route` and :meth:`stop` wait, with bounds."""

    def __init__(self, base_url: str | None, extra_hosts: Iterable[str] = (), **bounds: Any) -> None:
        self.allow = allow_list(base_url, extra_hosts)
        self.token = new_token()
        self._bounds = bounds  # RelayConfig's max_connections, idle_timeout_s, ...
        self._proxy_env = proxy_environment()  # the driver's: the relay goes through the site's proxy
        self._actor: Any = None
        self._asked: Any = None  # the one outstanding address() call, which route() waits on
        self._watch: Any = None  # the outstanding watch() call: it answers when the actor ends
        self._host = ""

    def start(self) -> None:
        """Create the actor on this node (returns at once)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._host = ray.util.get_node_ip_address()  # the address the cluster's nodes reach this one by
        bounds = {"peers": cluster_addresses, "proxy_env": self._proxy_env, **self._bounds}
        config = RelayConfig(self.allow, self.token, self._host, 0, **bounds)  # 0: bound as chosen
        node = ray.get_runtime_context().get_node_id()
        self._actor = (
            ray.remote(RelayActor)
            .options(
                num_cpus=0,
                max_restarts=0,  # never again on the same port: see the module's docstring
                max_concurrency=4,  # watch, address, stats and stop answer side by side
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote(config)
        )
        self._watch = self._actor.watch.remote()

    @property
    def actor(self) -> Any:
        """The relay's actor handle (None before :meth:`start` and after :meth:`stop`)."""
        return self._actor

    def route(self, timeout_s: float) -> RelayRoute | None:
        """Where writers find the relay, once it listens (None: it did not within ``timeout_s``;
        0 asks without waiting, and asking again waits on the same call). Raises what the actor
        raised when it could not start (its address taken, its node gone)."""
        import ray

        if self._actor is None:
            return None
        if self._asked is None:
            self._asked = self._actor.address.remote()
        ready, _ = ray.wait([self._asked], timeout=timeout_s)
        if not ready:
            return None
        host, port = ray.get(self._asked)
        return RelayRoute(host, port, self.token)

    def stats(self, timeout_s: float) -> RelayStats | None:
        return self._ask("stats", timeout_s)

    def gone(self) -> str | None:
        """Why the relay's actor ended before :meth:`stop` (None: it runs, or was stopped);
        asks without waiting."""
        import ray

        if self._watch is None:
            return None
        ready, _ = ray.wait([self._watch], timeout=0)
        if not ready:
            return None
        self._watch = None
        try:
            ray.get(ready[0])
            return "it stopped"
        except Exception as e:  # noqa: BLE001 - the actor died: how is the answer
            return f"its actor died ({type(e).__name__})"

    def stop(self, timeout_s: float) -> RelayStats | None:
        """Stop the relay (every connection closed) and end its actor; what it served (None: it
        did not answer in time, and was ended all the same)."""
        import ray

        if self._actor is None:
            return None
        self._watch = None  # its answer now is the stop's, not a death
        stats = self._ask("stop", timeout_s)
        try:
            ray.kill(self._actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._actor = self._asked = None
        return stats

    def _ask(self, method: str, timeout_s: float) -> RelayStats | None:
        import ray

        if self._actor is None:
            return None
        ref = getattr(self._actor, method).remote()
        ready, _ = ray.wait([ref], timeout=timeout_s)
        if not ready:
            return None
        try:
            stats: RelayStats = ray.get(ref)
        except Exception:  # noqa: BLE001 - the actor died: nothing to say
            return None
        return stats
