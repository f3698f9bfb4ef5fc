"""``LoggerJanitor``: removes a fleet's placement groups if the controller that owns them dies.

Logger actors fate-share with the controller that created them (the Train controller, an actor),
but its placement groups do not: a group lives until its job ends. So each job has one small
detached janitor, named by the job: the first fleet of the job that runs inside an actor starts
it, every later one (the next fit, Tune's trials that wrap a Train run) finds it by its name. A
fleet registers its owner (``watch``) before it creates a group and releases it once its groups
are gone (``release``). Every ``CHECK_S`` the janitor reads each watched owner's state in the GCS
actor table; once an owner is dead, it removes every placement group whose name starts with that
owner's prefix. It ends itself once its job has ended (read every ``JOB_CHECK_S`` while it watches
nobody). It takes no resources: one process a job, idle between fits, instead of one a fit.
"""

from __future__ import annotations

import threading
import time

CHECK_S = 1.0
JOB_CHECK_S = 10.0  # the job table lists every job of the cluster: read it rarely, and only when idle


def group_prefix(owner_actor_id: str) -> str:
    """The name prefix of the placement groups the fleet of ``owner_actor_id`` creates."""
    return f"ray_wandb_nodes:{owner_actor_id}:"


def janitor_name(job_id: str) -> str:
    """The name of ``job_id``'s janitor (in the plugin's namespace)."""
    return f"janitor:{job_id}"


class LoggerJanitor:
    def __init__(self, job_id: str, owner_actor_id: str | None = None) -> None:
        """``owner_actor_id``: the owner of the fleet that starts the janitor, watched from the
        constructor on (the creation goes through the GCS, so it holds even where that owner dies
        before the janitor's process has started, as a call from the owner would not)."""
        self._job = job_id
        self._owners: dict[str, None] = {owner_actor_id: None} if owner_actor_id else {}
        self._lock = threading.Lock()
        self.removed = 0
        self._job_read = time.monotonic()
        threading.Thread(target=self._watch, name="ray_wandb_nodes-janitor", daemon=True).start()

    def watch(self, owner_actor_id: str) -> None:
        with self._lock:
            self._owners[owner_actor_id] = None

    def release(self, owner_actor_id: str) -> None:
        with self._lock:
            self._owners.pop(owner_actor_id, None)

    def watching(self) -> list[str]:
        with self._lock:
            return list(self._owners)

    def _watch(self) -> None:
        while True:
            time.sleep(CHECK_S)
            if self.turn(time.monotonic()):
                break
        import ray

        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def turn(self, now: float) -> bool:
        """One look: every dead owner's groups removed (and the owner released); True once the
        janitor, watching nobody, finds its job ended (read once every ``JOB_CHECK_S``)."""
        from .. import _ray

        for owner in self.watching():
            try:
                info = _ray.actor_state(owner)
            except Exception:  # noqa: BLE001 - the GCS may be briefly unreachable
                continue
            if info and info.get("State") != "DEAD":
                continue
            self.removed += _ray.remove_placement_groups(group_prefix(owner))
            self.release(owner)
        if self.watching() or now - self._job_read < JOB_CHECK_S:
            return False
        self._job_read = now
        try:
            return _ray.job_ended(self._job)
        except Exception:  # noqa: BLE001 - read again next time
            return False
