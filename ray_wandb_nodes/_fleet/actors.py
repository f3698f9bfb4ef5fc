"""How the logger pool reaches Ray: creating a logger actor in its node's placement group,
killing it, and asking which calls have answered. One seam, so that ``bench/fleet_scale.py`` can
drive the real fleet with thousands of simulated nodes and no actor at all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _ray
from .._warn import describe

# A bundle must hold some resource; a little memory never competes with train workers,
# whereas a CPU fraction can leave whole-CPU workers unschedulable forever.
BUNDLE = {"memory": float(1 << 20)}


PG_NAME_PREFIX = "ray_wandb_nodes"

# How often Ray retries a call on a logger whose process died. A killed process comes back in its
# bundle (``max_restarts=-1``) and the call runs there. A logger whose node is gone cannot come
# back (its bundle is pinned to that node): a call in flight then fails (``ActorUnavailableError``)
# once these retries are spent, about 5 s after the node went (Ray 2.60, a node removed from a
# local cluster), where retries without end (-1) left it unanswered for as long as the run lasted.
# A call made once Ray has the node dead waits for a restart; the pool's drop of the node's logger
# (``kill``, on the fleet's next node listing) ends it at once.
CALL_RETRIES = 2


class RayActors:
    def __init__(self, warner: Any = None) -> None:
        self._actor_cls: Any = None
        self._warner = warner
        self._prefix: str | None = None
        self._janitor: Any = None
        self.failed_calls = 0  # calls whose logger died or stayed unreachable past CALL_RETRIES

    def group_prefix(self) -> str:
        """The name prefix of this pool's placement groups. Inside an actor (the Train
        controller) it names that actor, and the job's detached janitor removes the groups
        should the actor die; a driver's groups end with its job."""
        if self._prefix is None:
            from .janitor import group_prefix

            owner = _ray.current_actor_id()
            self._prefix = group_prefix(owner) if owner else f"{PG_NAME_PREFIX}:driver:"
            if owner:
                self._watch_by_janitor(owner)
        return self._prefix

    def _watch_by_janitor(self, owner: str) -> None:
        """The job's janitor (started by the job's first fleet in an actor, on that actor's node:
        the driver's, which a lost worker node does not take with it) watches ``owner``."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            from .janitor import LoggerJanitor, janitor_name

            context = ray.get_runtime_context()
            job = context.get_job_id()
            janitor = (
                ray.remote(LoggerJanitor)
                .options(
                    name=janitor_name(job),
                    namespace=PG_NAME_PREFIX,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,  # one call at a time: a fleet's watch and release come in order
                    # Held there: a soft affinity lets Ray place it on another node, even where
                    # this one could hold it (a head of 0 CPUs), and a lost node takes it along.
                    scheduling_strategy=NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False),
                )
                .remote(job, owner)  # the constructor's arguments where this starts it
            )
            janitor.watch.remote(owner)  # where it was running already
            self._janitor = (janitor, owner)
        except Exception as e:  # noqa: BLE001
            if self._warner is not None:
                self._warner.warn("janitor", f"placement groups may outlive a crashed controller ({describe(e)})")

    def close(self) -> None:
        """The janitor watches this pool's owner no longer (the pool's groups are gone)."""
        if self._janitor is not None:
            janitor, owner = self._janitor
            try:
                janitor.release.remote(owner)
            except Exception:  # noqa: BLE001
                pass
            self._janitor = None
        self._prefix = None

    def create(self, node_id: str, group_name: str) -> tuple[Any, Any]:
        """A ``NodeLogger`` on ``node_id``, in a placement group of its own (one bundle, pinned
        by the node's NodeID label, so that a lost node's group goes with it)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._actor_cls is None:
            from .node_logger import logger_class

            self._actor_cls = logger_class()  # its status, watches and ends never wait on a writer
        pg = placement_group(
            [dict(BUNDLE)], strategy="STRICT_SPREAD", name=group_name, **_ray.pin_bundles_to_nodes([node_id])
        )
        actor = self._actor_cls.options(
            num_cpus=0,
            # A killed logger process comes back in its bundle; calls in flight are retried there,
            # a bounded number of times: a dead node's logger never comes back.
            max_restarts=-1,
            max_task_retries=CALL_RETRIES,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0),
        ).remote()
        return actor, pg

    def kill(self, actor: Any, pg: Any) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            if pg is not None:
                remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - already removed
            pass

    def answered(self, refs: Sequence[Any]) -> set[Any]:
        """Those of ``refs`` whose call has answered (or failed), without waiting."""
        import ray

        if not refs:
            return set()
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        return set(ready)

    def result(self, ref: Any) -> Any:
        """The answer of a call that has answered; raises when the call or its actor failed (a
        logger that died or stayed unreachable: counted in ``failed_calls``)."""
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(ref, timeout=0)
        except RayActorError:
            self.failed_calls += 1
            raise
