"""``LoggerJanitor``: removes the fleet's placement groups if the Train controller dies.

Logger actors fate-share with the controller that created them, but its placement groups
do not: a non-detached placement group lives until the job ends. So the fleet, when it runs
inside an actor, starts one small detached janitor. It watches the owner in the GCS actor
table from its constructor on (calls from an owner that died before the janitor started
would be lost) and, once the owner is dead, removes every placement group whose name starts
with the owner's prefix, then ends itself. A normal end stops it. It takes no resources.
"""

from __future__ import annotations

import threading

CHECK_S = 1.0


def group_prefix(owner_actor_id: str) -> str:
    """The name prefix of the placement groups the fleet of ``owner_actor_id`` creates."""
    return f"ray_wandb_nodes:{owner_actor_id}:"


class LoggerJanitor:
    def __init__(self, owner_actor_id: str) -> None:
        self._owner = owner_actor_id
        self._stop = threading.Event()
        self.removed = 0
        threading.Thread(target=self._watch, name="ray_wandb_nodes-janitor", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        import ray

        from .. import _ray

        while not self._stop.wait(CHECK_S):
            try:
                info = _ray.actor_state(self._owner)
            except Exception:  # noqa: BLE001 - the GCS may be briefly unreachable
                continue
            if info and info.get("State") != "DEAD":
                continue
            self.removed += _ray.remove_placement_groups(group_prefix(self._owner))
            break
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
