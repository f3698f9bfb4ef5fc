"""The way a node writer takes to W&B, found before it joins: straight, through the relay, or
offline; at most two checks, and what each way makes of the writer's spec."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._egress import (
    Egress,
    Endpoint,
    Reach,
    Reachability,
    RelayRoute,
    Way,
    WriterEgress,
    find_way,
    for_way,
    online,
)
from ray_wandb_nodes._wandb.writers import Role, WriterSpec

ROUTE = RelayRoute("198.18.0.1", 40123, Secret("s3cr3t-tok"))
BASE = "https://wandb.corp:8443"
SPEC = WriterSpec(
    role=Role.NODE, label="node-a", init_kwargs={"id": "r1"}, settings={"base_url": BASE, "mode": "shared"}
)


class Checks:
    """``check_reach`` as the test scripts it: each call's (url, proxy, timeout) noted; the
    outcomes given, direct first."""

    def __init__(self, *outcomes: Reach) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, str | None, float]] = []

    def __call__(self, url: str, *, proxy: str | None, timeout_s: float) -> Reachability:
        self.calls.append((url, proxy, timeout_s))
        outcome = self.outcomes.pop(0)
        error = "" if outcome is Reach.REACHABLE else "Network is unreachable"
        return Reachability(outcome, Endpoint("wandb.corp", 8443), proxy and "198.18.0.1:40123", error, 0.25)


def test_a_node_that_reaches_wandb_goes_straight_and_never_asks_the_relay() -> None:
    checks = Checks(Reach.REACHABLE)
    found = find_way(SPEC, WriterEgress(route=ROUTE, timeout_s=2.0), environ={}, check=checks)
    assert found.way is Way.DIRECT and found.relayed is None
    assert checks.calls == [(BASE, None, 2.0)]
    assert for_way(SPEC, found, ROUTE) == SPEC  # nothing changes: no proxy, online


def test_a_site_proxy_in_the_node_s_environment_is_the_way_its_check_goes() -> None:
    checks = Checks(Reach.REACHABLE)
    find_way(SPEC, WriterEgress(), environ={"HTTPS_PROXY": "http://site-proxy:3128"}, check=checks)
    assert checks.calls == [(BASE, "http://site-proxy:3128", WriterEgress().timeout_s)]


def test_without_a_route_and_without_a_relay_the_writer_writes_offline_after_one_check() -> None:
    checks = Checks(Reach.UNREACHABLE)
    found = find_way(SPEC, WriterEgress(), environ={}, check=checks)
    assert (found.way, len(checks.calls), found.seconds) == (Way.OFFLINE, 1, 0.25)
    assert found.describe() == "wandb.corp:8443 unreachable (Network is unreachable)"
    offline = for_way(replace(SPEC, settings={**SPEC.settings, "https_proxy": "x"}), found, None)
    assert offline.settings == {"base_url": BASE, "mode": "offline"}  # its run on its node, no proxy
    assert (offline.label, offline.init_kwargs) == (SPEC.label, SPEC.init_kwargs)


def test_without_a_route_a_writer_goes_through_the_relay_when_its_check_there_passes() -> None:
    checks = Checks(Reach.UNREACHABLE, Reach.REACHABLE)
    found = find_way(SPEC, WriterEgress(route=ROUTE, timeout_s=3.0), environ={}, check=checks)
    assert found.way is Way.RELAY and found.relayed is not None and found.seconds == 0.5
    assert checks.calls == [(BASE, None, 3.0), (BASE, ROUTE.proxy_url(), 3.0)]
    relayed = for_way(SPEC, found, ROUTE)
    assert relayed.settings == {**SPEC.settings, "https_proxy": ROUTE.proxy_url(), "http_proxy": ROUTE.proxy_url()}
    with pytest.raises(ValueError, match="relay's route"):
        for_way(SPEC, found, None)


def test_a_relay_that_fails_too_leaves_the_writer_offline_and_both_checks_are_said() -> None:
    found = find_way(SPEC, WriterEgress(route=ROUTE), environ={}, check=Checks(Reach.TIMED_OUT, Reach.REFUSED))
    assert found.way is Way.OFFLINE
    assert found.describe() == (
        "wandb.corp:8443 timed out (Network is unreachable); "
        "wandb.corp:8443 through 198.18.0.1:40123 refused (Network is unreachable)"
    )


def test_only_writers_that_send_to_wandb_are_checked() -> None:
    assert online(SPEC) and online(replace(SPEC, role=Role.RUN))
    assert not online(replace(SPEC, settings={"mode": "offline"}))
    assert not online(replace(SPEC, role=Role.OBSERVER))


def test_the_way_crosses_as_plain_data() -> None:
    import pickle

    found: Any = Egress(Way.RELAY, Checks(Reach.UNREACHABLE)(BASE, proxy=None, timeout_s=1.0))
    assert pickle.loads(pickle.dumps(found)) == found
    assert "s3cr3t" not in repr(pickle.loads(pickle.dumps(WriterEgress(route=ROUTE))))
