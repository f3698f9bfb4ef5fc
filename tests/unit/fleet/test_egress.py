"""The fleet's side of egress: the run's relay (started once, joins held until it listens, given
up on with one warning), the ways the joins found (said in the run's config), one warning a batch
of nodes without a route, and their offline runs' folder for the run's end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._egress import Egress, Endpoint, Reach, Reachability, RelayRoute, RelayStats, Way
from ray_wandb_nodes._fleet import egress as egress_module
from ray_wandb_nodes._fleet.egress import CONFIG_KEY, NAMED, FleetEgress, Found, RelayPlan, no_route_warning
from ray_wandb_nodes._fleet.nodes import NodeInfo
from ray_wandb_nodes._fleet.targets import SharedTarget
from ray_wandb_nodes._wandb.writers import Role, WriterSpec

ROUTE = RelayRoute("198.18.0.1", 40123, Secret("tok"))
TARGET = Endpoint("wandb.corp", 443)
RUN = "run-1"


class Said:
    """A Warner that keeps what it said."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def warn(self, key: str, message: str) -> None:
        self.lines.append(message)


class FakeRelay:
    def __init__(self, plan: RelayPlan) -> None:
        self.plan, self.started, self.answer, self.stopped = plan, False, None, False
        self.fail: Exception | None = None
        self.died: str | None = None
        self.final: RelayStats | None = None

    def start(self) -> None:
        self.started = True

    def route(self, timeout_s: float) -> RelayRoute | None:
        assert timeout_s == 0  # the fleet thread never waits on it
        if self.fail is not None:
            raise self.fail
        return self.answer

    def gone(self) -> str | None:
        return self.died

    def stop(self, timeout_s: float) -> RelayStats | None:
        self.stopped = True
        return self.final


class Primary:
    """What the fleet uses of a run's primary here: its spec and the config it is told."""

    def __init__(self, folder: Path) -> None:
        self.spec = WriterSpec(Role.PRIMARY, "node-head", {"id": RUN, "dir": str(folder), "project": "p"}, {})
        self.index = None
        self.configs: list[dict[str, Any]] = []

    def update_config(self, config: dict[str, Any]) -> None:
        self.configs.append(json.loads(json.dumps(config)))  # plain data, as it reaches wandb


def found(way: Way, outcome: Reach = Reach.UNREACHABLE) -> Egress:
    direct = Reachability(outcome, TARGET, None, "Network is unreachable", 0.01)
    if way is Way.DIRECT:
        return Egress(way, Reachability(Reach.REACHABLE, TARGET, None, "", 0.01))
    relayed = Reachability(Reach.REACHABLE, TARGET, "198.18.0.1:40123", "", 0.01) if way is Way.RELAY else None
    return Egress(way, direct, relayed)


def handle(n: int) -> Any:
    return SimpleNamespace(node=NodeInfo(f"n{n}", f"host-{n}", f"10.0.0.{n}"))


class Pool:
    def __init__(self) -> None:
        self.egress = None
        self.out: set[str] = set()

    def joining(self, run_id: str) -> bool:
        return run_id in self.out

    def get(self, node_id: str) -> None:
        return None  # no logger handle: a relay's death tells none (see egress.watch)


@pytest.fixture
def target(tmp_path: Path) -> SharedTarget:
    return SharedTarget(primary=Primary(tmp_path))  # type: ignore[arg-type]


def test_no_relay_is_started_without_the_option_and_nothing_is_held() -> None:
    made: list[RelayPlan] = []
    fleet = FleetEgress(Said(), None, relay=lambda p: made.append(p) or FakeRelay(p))  # type: ignore[arg-type]
    fleet.start()
    fleet.poll(Pool())  # type: ignore[arg-type]
    assert (made, fleet.holding, fleet.stop()) == ([], False, None)


def test_joins_are_held_until_the_relay_listens_then_every_writer_gets_its_route() -> None:
    relays: list[FakeRelay] = []
    plan = RelayPlan("https://wandb.corp", ("storage.corp",))
    fleet = FleetEgress(Said(), plan, relay=lambda p: relays.append(FakeRelay(p)) or relays[-1])  # type: ignore[arg-type]
    pool = Pool()
    fleet.start()
    fleet.start()  # once
    assert len(relays) == 1 and relays[0].started and relays[0].plan == plan and fleet.holding
    fleet.poll(pool)  # type: ignore[arg-type]
    assert fleet.holding and pool.egress is None
    relays[0].answer = ROUTE  # type: ignore[assignment]
    fleet.poll(pool)  # type: ignore[arg-type]
    assert not fleet.holding and pool.egress is not None and pool.egress.route == ROUTE
    fleet.stop()
    assert relays[0].stopped and fleet.relay is None


def test_a_relay_that_never_listens_is_given_up_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    said = Said()
    now = [100.0]
    monkeypatch.setattr(egress_module.time, "monotonic", lambda: now[0])
    fleet = FleetEgress(said, RelayPlan(None), relay=FakeRelay)  # type: ignore[arg-type]
    fleet.start()
    now[0] += egress_module.RELAY_START_S - 1
    fleet.poll(Pool())  # type: ignore[arg-type]
    assert fleet.holding and said.lines == []
    now[0] += 2
    fleet.poll(Pool())  # type: ignore[arg-type]
    assert not fleet.holding
    assert said.lines == [
        f"the relay for node writers without a route to W&B is off: it did not listen within "
        f"{egress_module.RELAY_START_S:.0f}s; such nodes write offline"
    ]


def test_a_relay_whose_actor_fails_is_given_up_at_once() -> None:
    said = Said()
    relay = FakeRelay(RelayPlan(None))
    relay.fail = OSError("Address already in use")
    fleet = FleetEgress(said, RelayPlan(None), relay=lambda p: relay)  # type: ignore[arg-type]
    fleet.start()
    fleet.poll(Pool())  # type: ignore[arg-type]
    assert not fleet.holding and "its actor failed (OSError: Address already in use)" in said.lines[0]


def test_the_run_s_config_says_each_node_s_way_and_only_the_nodes_without_one_are_warned_of(
    target: SharedTarget,
) -> None:
    said, pool = Said(), Pool()
    fleet = FleetEgress(said, RelayPlan(None))  # type: ignore[arg-type]
    a, b, c = (handle(n) for n in (1, 2, 3))
    hosted: list[tuple[str, str]] = []
    pool.out = {RUN}  # c's join has not answered yet
    fleet.took([(a, RUN, found(Way.DIRECT)), (b, RUN, found(Way.RELAY))], {RUN: target}, lambda *k: hosted.append(k))
    fleet.announce(pool)  # type: ignore[arg-type]
    primary: Any = target.primary
    assert primary.configs[-1] == {
        CONFIG_KEY: {"node-head": "direct", "node-host-1-n1": "direct", "node-host-2-n2": "relay"}
    }
    assert (said.lines, hosted, target.fallback) == ([], [], None)  # the healthy ways: no warning, no folder

    fleet.took([(c, RUN, found(Way.OFFLINE))], {RUN: target}, lambda *k: hosted.append(k))
    fleet.announce(pool)  # type: ignore[arg-type]
    assert said.lines == []  # its run's joins are still out: one warning for all of them, later
    assert primary.configs[-1][CONFIG_KEY]["node-host-3-n3"] == "offline"
    assert hosted == [("n3", RUN)] and target.fallback is not None
    assert Path(target.fallback.folder).is_dir()
    pool.out = set()
    fleet.announce(pool)  # type: ignore[arg-type]
    fleet.announce(pool)  # type: ignore[arg-type]
    assert len(said.lines) == 1 and "1 node of the W&B run run-1 cannot reach W&B: node-host-3-n3 (" in said.lines[0]
    assert said.lines[0].endswith(
        "the relay was off when they joined (see the warning above)"
    )  # the run has the option

    told = len(primary.configs)
    fleet.took([(c, RUN, found(Way.OFFLINE))], {RUN: target}, lambda *k: None)  # its writer joins again (a restart)
    fleet.announce(pool)  # type: ignore[arg-type]
    assert (len(said.lines), len(primary.configs)) == (1, told)  # named once; its way did not change
    fleet.forget(RUN)
    assert fleet.ways == {}


def test_observers_and_ended_runs_take_no_way() -> None:
    fleet = FleetEgress(Said(), None)  # type: ignore[arg-type]
    fleet.took([(handle(1), f"{RUN}:observe", found(Way.OFFLINE))], {}, lambda *k: None)
    fleet.took([(handle(1), "gone", found(Way.OFFLINE))], {}, lambda *k: None)
    assert fleet.ways == {}


def test_the_warning_names_each_node_and_what_it_found_and_the_option_that_fixes_it() -> None:
    many = [Found(f"node-{i:02}", found(Way.OFFLINE)) for i in range(NAMED + 3)]
    text = no_route_warning(RUN, many, relay=False)
    assert text.startswith(f"{NAMED + 3} nodes of the W&B run {RUN} cannot reach W&B: node-00 (wandb.corp:443 ")
    assert f"node-{NAMED - 1:02} (" in text and f"node-{NAMED:02}" not in text and "; and 3 more." in text
    assert text.endswith("egress=\"relay\" sends them live through the Train controller's node (the Tune driver's)")
    assert no_route_warning(RUN, many[:1], relay=True).endswith(
        "the relay was off when they joined (see the warning above)"
    )
    both = found(Way.RELAY)
    failed = [Found("node-00", Egress(Way.OFFLINE, both.direct, both.relayed))]  # through the relay too
    assert no_route_warning(RUN, failed, relay=True).endswith(
        "nor did they reach it through the relay (see each node's checks)"
    )


def test_a_relay_that_dies_mid_run_has_its_writers_brought_in_at_the_end(target: SharedTarget) -> None:
    said, pool = Said(), Pool()
    relay = FakeRelay(RelayPlan(None))
    relay.answer = ROUTE  # type: ignore[assignment]
    fleet = FleetEgress(said, RelayPlan(None), relay=lambda p: relay)  # type: ignore[arg-type]
    fleet.start()
    fleet.poll(pool)  # type: ignore[arg-type]
    hosted: list[tuple[str, str]] = []
    a, b = handle(1), handle(2)
    fleet.took([(a, RUN, found(Way.RELAY)), (b, RUN, found(Way.DIRECT))], {RUN: target}, lambda *k: hosted.append(k))
    fleet.watch(pool, {RUN: target}, lambda *k: hosted.append(k))  # type: ignore[arg-type]
    assert (said.lines, hosted, fleet.lost) == ([], [], None)  # a live relay: nothing happens

    relay.died = "its actor died (ActorDiedError)"
    fleet.watch(pool, {RUN: target}, lambda *k: hosted.append(k))  # type: ignore[arg-type]
    fleet.watch(pool, {RUN: target}, lambda *k: hosted.append(k))  # type: ignore[arg-type]
    assert hosted == [("n1", RUN)] and target.fallback is not None  # collected and synced at the end
    assert pool.egress is not None and pool.egress.route is None  # joins from now: straight, else offline
    primary: Any = target.primary
    assert primary.configs[-1][CONFIG_KEY]["node-host-1-n1"] == "offline"
    assert primary.configs[-1][CONFIG_KEY]["node-host-2-n2"] == "direct"
    [line] = said.lines
    assert "ended mid-run (its actor died (ActorDiedError))" in line and "node-host-1-n1" in line

    fleet.took([(handle(3), RUN, found(Way.RELAY))], {RUN: target}, lambda *k: hosted.append(k))
    assert hosted[-1] == ("n3", RUN)  # a join that went through it as it died: brought in too


def test_the_hosts_the_relay_refused_the_run_s_writers_are_said_once_at_its_end() -> None:
    said = Said()
    relay = FakeRelay(RelayPlan(None))
    relay.final = RelayStats(0, 1, 9, 1, 0, 0, 0, 0, {"NOT_ALLOWED": 7, "AUTH": 500},
                             refused_hosts={"minio.corp:9000 (NOT_ALLOWED)": 7})  # fmt: skip
    fleet = FleetEgress(said, RelayPlan(None), relay=lambda p: relay)  # type: ignore[arg-type]
    fleet.start()
    fleet.stop()
    [line] = said.lines
    assert "minio.corp:9000 (NOT_ALLOWED) x7" in line and "egress_hosts" in line and "AUTH" not in line

    quiet, healthy = Said(), FakeRelay(RelayPlan(None))
    healthy.final = RelayStats(0, 1, 9, 1, 0, 0, 0, 0, {"AUTH": 500})  # a co-tenant's, not the run's
    fleet = FleetEgress(quiet, RelayPlan(None), relay=lambda p: healthy)  # type: ignore[arg-type]
    fleet.start()
    fleet.stop()
    assert quiet.lines == []


def test_egress_hosts_that_reach_any_bucket_are_named_in_a_warning() -> None:
    for hosts, named in [((), False), (("minio.corp:9000",), False), (("*.s3.amazonaws.com",), True)]:
        said = Said()
        relay = FakeRelay(RelayPlan(None, hosts))
        relay.allow = egress_module.RelayOnNode(None, hosts).allow  # type: ignore[attr-defined]
        fleet = FleetEgress(said, RelayPlan(None, hosts), relay=lambda p, r=relay: r)  # type: ignore[misc]
        fleet.start()
        assert bool(said.lines) is named and (not named or "*.s3.amazonaws.com:443" in said.lines[0])
