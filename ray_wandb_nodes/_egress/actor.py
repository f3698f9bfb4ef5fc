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
first (``RelayOnNode.stop``). Should the relay's process die mid-run, Ray restarts it on the same
port (chosen before the first start), and the writers' requests, which wandb's client retries,
go through again.
"""

from __future__ import annotations

import resource
import socket
from collections.abc import Iterable
from typing import Any

from .allow import allow_list
from .relay import RelayConfig, RelayStats
from .route import RelayRoute, new_token
from .runner import RelayThread

_RESTARTS = 3
_DESCRIPTORS_SPARE = 256


class RelayActor:
    """The actor's class (made remote by :class:`RelayOnNode`): one relay thread in its process."""

    def __init__(self, config: RelayConfig) -> None:
        raise_descriptor_limit(2 * config.max_connections + _DESCRIPTORS_SPARE)
        self._relay = RelayThread(config)
        self._relay.start()

    def address(self) -> tuple[str, int]:
        assert self._relay.address is not None
        return self._relay.address

    def stats(self) -> RelayStats:
        return self._relay.stats()

    def stop(self) -> RelayStats:
        return self._relay.stop()


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


def free_port(host: str) -> int:
    """A port free on ``host`` now (the actor binds it again on every start of its process)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class RelayOnNode:
    """The relay's actor as the driver side sees it: started on this process's node, its route
    once it answers, stopped with the run. Call it from a background thread (the fleet's), never
    from a hook: :meth:`route` and :meth:`stop` wait, with bounds."""

    def __init__(self, base_url: str | None, extra_hosts: Iterable[str] = (), **bounds: Any) -> None:
        self.allow = allow_list(base_url, extra_hosts)
        self.token = new_token()
        self._bounds = bounds  # RelayConfig's max_connections, idle_timeout_s, ...
        self._actor: Any = None
        self._asked: Any = None  # the one outstanding address() call, which route() waits on
        self._host = ""
        self._port = 0

    def start(self) -> None:
        """Create the actor on this node (returns at once)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._host = ray.util.get_node_ip_address()  # the address the cluster's nodes reach this one by
        self._port = free_port(self._host)
        config = RelayConfig(self.allow, self.token, self._host, self._port, **self._bounds)
        node = ray.get_runtime_context().get_node_id()
        self._actor = (
            ray.remote(RelayActor)
            .options(
                num_cpus=0,
                max_restarts=_RESTARTS,
                max_concurrency=4,  # stats and stop answer while a call waits
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            )
            .remote(config)
        )

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

    def stop(self, timeout_s: float) -> RelayStats | None:
        """Stop the relay (every connection closed) and end its actor; what it served (None: it
        did not answer in time, and was ended all the same)."""
        import ray

        if self._actor is None:
            return None
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
