"""The fleet's node listing (``_fleet/listing.py``) on its own, on a clock the test moves: read
once a poll (and at once when a run's end asks), a change says so and replaces the alive nodes,
no change keeps the same object; a listing that does not answer in time leaves the last one."""

from __future__ import annotations

import threading
from typing import Any

from ray_wandb_nodes._fleet.listing import NodeListing, bounded


class Cluster:
    def __init__(self) -> None:
        self.up = {"n1": True, "n2": True}
        self.reads = 0
        self.now = 0.0

    def list_nodes(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [{"NodeID": n, "Alive": up, "NodeManagerHostname": f"h-{n}"} for n, up in self.up.items()]


def test_the_listing_is_read_once_a_poll_and_a_change_replaces_the_alive_nodes() -> None:
    cluster = Cluster()
    listing = NodeListing(poll_s=3.0, list_nodes=cluster.list_nodes, free_resources=dict, clock=lambda: cluster.now)
    assert listing.refresh() and set(listing.alive) == {"n1", "n2"} and cluster.reads == 1
    alive = listing.alive
    cluster.now = 2.9
    assert not listing.refresh() and cluster.reads == 1  # not due
    cluster.now = 3.0
    assert not listing.refresh() and cluster.reads == 2 and listing.alive is alive  # due, the same nodes
    cluster.up["n2"] = False
    assert listing.refresh(now_s=1.0) and cluster.reads == 3  # a run's end: read now, whatever is due
    assert set(listing.alive) == {"n1"} and "n2" in listing.ended


def test_a_listing_that_does_not_answer_in_time_leaves_the_last_one() -> None:
    release = threading.Event()
    assert bounded(lambda: release.wait(5.0), 0.05) is None  # still waiting: no answer
    release.set()
    assert bounded(lambda: 1 / 0, 1.0) is None  # raises: no answer
    assert bounded(lambda: "nodes", 1.0) == "nodes"
