"""The fleet's side of egress: the run's relay (with ``egress="relay"``), the way each node writer
found to W&B, one warning a batch of nodes found without a route, and those nodes' offline runs
brought into the run at its end.

Each online writer's join checks its way on its node first (``_egress.way``) and answers with it
(``LoggerStatus.egress``); a shared run's config says each node's way (``node_egress``: label ->
``direct``, ``relay`` or ``offline``). A node without a route (and, with the relay, without a way through it
either) writes offline there: the fleet names it at once, in one warning with every other node of
the run found so with it (the joins of one placement answer within the checks' bound of each
other), makes the run's folder on the driver side for such nodes (``fallback``), and has the
offline collection bring the node's run there at the run's end and sync it into the run.

The relay: started on the fleet's thread when the fleet starts (an actor on this node, returning at
once; its route, address and port are chosen before it listens), polled without waiting, and
writers are held back from joining until it listens or ``RELAY_START_S`` passed (then the nodes
without a route write offline, and one warning says why). Watched while it runs (``watch``): if
its actor dies, the writers that sent through it are treated as nodes without a route (their runs,
kept on their nodes, brought in and synced at the end; one warning names them) and nodes joining
from then on check their way without it. Stopped once every run's writers have finished, as the
fleet stops, with one warning naming the hosts it refused the run's writers (a storage host
missing from ``egress_hosts``). Runs on the fleet thread only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._config.options import Options
from .._config.secrets import CapturedEnv
from .._config.values import EgressMode, Mode
from .._egress import Egress, RelayOnNode, RelayRoute, RelayStats, Way, WriterEgress
from .._wandb.sync import SyncInto
from .._wandb.writers import Role
from .._warn import Warner, describe, logger
from ..offline.index import OfflineIndex, offline_folder, open_index
from .plan import run_of
from .pool import LoggerHandle, LoggerPool
from .targets import RunTarget, SharedTarget, StandaloneTarget

CONFIG_KEY = "node_egress"  # the run's config: each writer's label -> its way to W&B ("direct", "relay", "offline")
RELAY_START_S = 30.0  # the relay's actor: a process on this node (seconds on a loaded machine)
RELAY_STOP_S = 5.0
NAMED = 20  # nodes a warning names; past them, a count


@dataclass(frozen=True)
class RelayPlan:
    """A run's wish for a relay: the W&B host it serves (None: W&B's cloud) and the user's hosts."""

    base_url: str | None
    hosts: tuple[str, ...] = ()

    @classmethod
    def of(cls, options: Options, env: CapturedEnv, mode: Mode) -> RelayPlan | None:
        """The relay of an online run with ``egress="relay"``: to the W&B host its writers send
        to (the driver's ``WANDB_BASE_URL``, else the ``base_url`` setting, else W&B's cloud)."""
        if options.egress is not EgressMode.RELAY or mode is not Mode.ONLINE:
            return None
        base_url = env.base_url or options.settings.get("base_url")
        return cls(str(base_url) if base_url else None, options.egress_hosts)


class Relay(Protocol):
    """What the fleet asks of the relay's actor (``_egress.RelayOnNode``; a fake in tests)."""

    def start(self) -> None: ...

    def route(self, timeout_s: float) -> RelayRoute | None: ...

    def gone(self) -> str | None: ...

    def stop(self, timeout_s: float) -> RelayStats | None: ...


@dataclass
class Found:
    """A node found without a way to W&B, not named in a warning yet."""

    label: str
    egress: Egress


def no_route_warning(run_id: str, found: list[Found], relay: bool) -> str:
    """The one warning of a batch of nodes without a route to W&B (pure); ``relay``: the run
    asked for the relay (``egress="relay"``)."""
    named = sorted(found, key=lambda f: f.label)
    nodes = "; ".join(f"{f.label} ({f.egress.describe()})" for f in named[:NAMED])
    if len(named) > NAMED:
        nodes += f"; and {len(named) - NAMED} more"
    count = f"{len(named)} node{'s' if len(named) != 1 else ''}"
    if not relay:
        fix = "egress=\"relay\" sends them live through the Train controller's node (the Tune driver's)"
    elif any(f.egress.relayed is not None for f in found):
        fix = "nor did they reach it through the relay (see each node's checks)"
    else:
        fix = "the relay was off when they joined (see the warning above)"
    return (
        f"{count} of the W&B run {run_id} cannot reach W&B: {nodes}. Their series are written offline on "
        f"their nodes and brought into the run when it ends (not live); {fix}"
    )


class FleetEgress:
    def __init__(self, warner: Warner, plan: RelayPlan | None, relay: Callable[[RelayPlan], Relay] | None = None):
        self._warner = warner
        self.plan = plan
        self._make = relay or (lambda p: RelayOnNode(p.base_url, p.hosts))
        self.relay: Relay | None = None
        self.route: RelayRoute | None = None
        self._started_at: float | None = None
        self._found: dict[str, dict[str, Found]] = {}  # run id -> node id -> not yet named
        self._named: set[tuple[str, str]] = set()  # (run id, node id) named once
        self.ways: dict[str, dict[str, Way]] = {}  # run id -> label -> its writer's way, as the run's config says
        self._batches = 0
        self._relayed: dict[str, dict[str, tuple[str, str]]] = {}  # run id -> node id -> (key, label) through the relay
        self.lost: str | None = None  # why the relay died mid-run (None: it did not)

    # the relay ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the relay's actor when the fleet's runs want one (returns at once)."""
        if self.plan is None or self.relay is not None:
            return
        try:
            self.relay = self._make(self.plan)
            self.relay.start()
            self._started_at = time.monotonic()
        except Exception as e:  # noqa: BLE001 - nodes without a route write offline instead
            self.relay = None
            self._give_up(f"it could not be started ({describe(e)})")
            return
        wide = getattr(self.relay, "allow", None)
        if wide is not None and wide.any_owner():
            self._warner.warn(
                "egress:any-owner",
                f"egress_hosts lets the relay reach hosts of any owner: {', '.join(wide.any_owner())} (any bucket "
                "of that service, not only the run's); a holder of the run's token can send there",
            )

    @property
    def holding(self) -> bool:
        """Whether writers wait for the relay to listen (it is starting, within its bound)."""
        return self._started_at is not None and self.route is None

    def poll(self, pool: LoggerPool) -> None:
        """Has the relay started listening? Its route goes to every writer joining from then on."""
        if self.relay is None or self._started_at is None or self.route is not None:
            return
        try:
            route = self.relay.route(0)
        except Exception as e:  # noqa: BLE001 - the actor died or could not bind
            self._give_up(f"its actor failed ({describe(e)})")
            return
        if route is not None:
            self.route = route
            pool.egress = WriterEgress(route=route)
        elif time.monotonic() - self._started_at > RELAY_START_S:
            self._give_up(f"it did not listen within {RELAY_START_S:.0f}s")

    def _give_up(self, why: str) -> None:
        self._started_at = None
        self._warner.warn(
            "egress:relay", f"the relay for node writers without a route to W&B is off: {why}; such nodes write offline"
        )

    def watch(self, pool: LoggerPool, targets: Mapping[str, RunTarget], hosted: Callable[..., Any]) -> None:
        """Did the relay die? Then its writers are nodes without a route (see the module's docstring)."""
        if self.relay is None or self.route is None or self.lost is not None:
            return
        try:
            why = self.relay.gone()
        except Exception as e:  # noqa: BLE001 - Ray could not say: as gone
            why = describe(e)
        if why is None:
            return
        self.lost = why
        pool.egress = WriterEgress()  # joins from now: straight, else offline
        labels: list[str] = []
        for run_id, writers in sorted(self._relayed.items()):
            target = targets.get(run_id)
            if target is None:
                continue
            labels += [label for _, label in writers.values()]
            for node_id, (key, _) in writers.items():  # their finish must not wait on the dead relay
                handle = pool.get(node_id)
                if handle is not None:
                    try:
                        handle.actor.relay_lost.remote(key)  # a control call: answered beside a finish
                    except Exception:  # noqa: BLE001 - its logger gone: its finish is bounded anyway
                        pass
            self._collect(run_id, target, [(node_id, key) for node_id, (key, _) in writers.items()], hosted)
            self.ways[run_id].update({label: Way.OFFLINE for _, label in writers.values()})
            tell_ways(target, self.ways[run_id])
        self._relayed.clear()
        named = ", ".join(sorted(labels)[:NAMED]) + (f" and {len(labels) - NAMED} more" if len(labels) > NAMED else "")
        self._warner.warn(
            "egress:relay-lost",
            f"the relay for node writers without a route to W&B ended mid-run ({why}): "
            + (f"the series of {named}, which sent through it, are kept on their nodes and brought into the run "
               "when it ends (not live); " if labels else "")
            + "nodes that join from now without a route write offline",
        )  # fmt: skip

    def _collect(
        self, run_id: str, target: RunTarget, writers: list[tuple[str, str]], hosted: Callable[..., Any]
    ) -> None:
        """``writers`` (node id, key) of ``run_id`` are brought into the run at its end."""
        if target.fallback is None:
            try:
                target.fallback = fallback_index(target)
            except OSError as e:  # its offline run stays on its node (the warning below says so)
                self._warner.warn(
                    f"egress-folder:{run_id}",
                    "the offline runs of nodes without a route to W&B stay on their nodes: their folder "
                    f"could not be made ({describe(e)})",
                )
                return
        for node_id, key in writers:
            hosted(node_id, key)

    def stop(self, timeout_s: float = RELAY_STOP_S) -> RelayStats | None:
        """Stop the relay (its connections closed, its actor ended), bounded; what it served, and
        one warning with the hosts it refused the run's writers."""
        relay, self.relay, self._started_at = self.relay, None, None
        if relay is None:
            return None
        try:
            stats = relay.stop(timeout_s)
        except Exception:  # noqa: BLE001 - ended all the same, or already gone
            return None
        if stats is not None and stats.refused_hosts:
            self._warner.warn("egress:refused", refused_warning(stats.refused_hosts))
        return stats

    # the ways the joins found ------------------------------------------------------------------
    def took(
        self, ways: list[tuple[LoggerHandle, str, Egress]], targets: Mapping[str, RunTarget], hosted: Callable[..., Any]
    ) -> None:
        """The ways joins found: a node without one is remembered for the warning, and its
        offline run for the run's end (``hosted(node_id, key)``: the offline collection's)."""
        told: set[str] = set()  # runs whose config learns a way
        for handle, key, egress in ways:
            run_id, observer = run_of(key)
            target = targets.get(run_id)
            if observer or target is None:
                continue
            if self.ways.setdefault(run_id, {}).get(handle.node.label) is not egress.way:
                self.ways[run_id][handle.node.label] = egress.way
                told.add(run_id)
            if egress.way is Way.RELAY and self.lost is not None:  # joined through it as it died
                self._collect(run_id, target, [(handle.node.node_id, key)], hosted)
            elif egress.way is Way.RELAY:
                self._relayed.setdefault(run_id, {})[handle.node.node_id] = (key, handle.node.label)
                logger.info(
                    "ray_wandb_nodes: %s of the W&B run %s sends through the relay (%s)",
                    handle.node.label,
                    run_id,
                    egress.describe(),
                )
            if egress.way is not Way.OFFLINE:
                continue
            node_id = handle.node.node_id
            self._collect(run_id, target, [(node_id, key)], hosted)
            if (run_id, node_id) not in self._named:
                self._found.setdefault(run_id, {})[node_id] = Found(handle.node.label, egress)
        for run_id in told:
            tell_ways(targets[run_id], self.ways[run_id])

    def forget(self, run_id: str) -> None:
        """``run_id`` ended: its ways go."""
        self.ways.pop(run_id, None)
        self._relayed.pop(run_id, None)

    def announce(self, pool: LoggerPool, ending: str | None = None) -> None:
        """One warning for each run's nodes found without a way, once none of its joins is out
        (``ending``: that run ends, its joins answered or not)."""
        for run_id in [r for r in self._found if r == ending or not pool.joining(r)]:
            found = self._found.pop(run_id)
            self._named.update((run_id, node_id) for node_id in found)
            self._batches += 1
            text = no_route_warning(run_id, list(found.values()), relay=self.plan is not None)
            self._warner.warn(f"egress:{run_id}:{self._batches}", text)


def refused_warning(hosts: Mapping[str, int]) -> str:
    """The run's end's warning of what the relay refused the run's writers (pure): each host and
    reason with its count, most first."""
    ranked = sorted(hosts.items(), key=lambda kv: (-kv[1], kv[0]))
    listed = "; ".join(f"{where} x{n}" for where, n in ranked[:NAMED])
    more = f"; and {len(ranked) - NAMED} more" if len(ranked) > NAMED else ""
    return (
        f"the relay refused node writers' requests: {listed}{more}. A host refused as NOT_ALLOWED is not on its "
        "allow-list: a storage host of a self-managed W&B server goes in egress_hosts"
    )


def tell_ways(target: RunTarget, ways: Mapping[str, Way]) -> None:
    """A shared run's config says which way each node writer takes to W&B (``CONFIG_KEY``, every
    node known so far: the key is replaced whole); the primary's own node writes straight, as the
    run's creator. A run of its own on a node (strategies ``node``, ``all``): its warnings say it."""
    if isinstance(target, SharedTarget):
        config = {label: way.value for label, way in sorted(ways.items())}
        target.primary.update_config({CONFIG_KEY: {target.primary.spec.label: Way.DIRECT.value, **config}})


def fallback_index(target: RunTarget) -> OfflineIndex:
    """The folder, on the driver side, of an online run's nodes that write offline (beside the
    run's own wandb folder): ``<dir>/ray_wandb_nodes/<run id>``, with its index."""
    if isinstance(target, SharedTarget):
        kwargs = target.primary.spec.init_kwargs
    else:
        assert isinstance(target, StandaloneTarget)
        kwargs = target.writer.init_kwargs
    base = str(kwargs.get("dir") or os.getcwd())
    index = open_index(
        offline_folder(base, target.run_id),
        run_id=target.run_id,
        project=kwargs.get("project"),
        name=kwargs.get("name"),
        group=kwargs.get("group"),
    )
    index.update(fallback=True)  # the run is online: these are its nodes without a route to W&B
    return index


def sync_into(target: RunTarget) -> SyncInto:
    """Where a node's offline run goes at the run's end: the run, with its own host and key."""
    if isinstance(target, StandaloneTarget):
        spec, role = target.writer, Role.RUN
        project, entity = spec.init_kwargs.get("project"), spec.init_kwargs.get("entity")
    else:
        assert isinstance(target, SharedTarget)
        spec, role = target.primary.spec, Role.NODE
        project = target.primary.project or spec.init_kwargs.get("project")
        entity = target.primary.entity or spec.init_kwargs.get("entity")
    return SyncInto(
        run_id=target.run_id,
        role=role,
        project=project,
        entity=entity,
        base_url=spec.settings.get("base_url"),
        api_key=spec.api_key,
    )
