"""End to end where the host matters: worker nodes that are hosts of their own (``tests/support/hosts.py``),
each with its own address, hostname, ``/etc/hosts``, ``/dev/shm`` and processes, its raylet started
with ``ray start``; the head and the driver on the machine; the W&B backend on an address of its own.

Two hosts named as two pods of one KubeRay worker group (names longer than a label keeps, that
differ only in their last characters), with scripted GPUs. One fit serves the checks of labels and
hostnames, GPUs and hang evidence (``hung_fit``): a TorchTrainer of four ranks over gloo, two a
host; rank 3 stops at step 2 until the test has seen the hang in the run and each host's beacons.
A Tune experiment of one trial a host sends host a's series through the relay on its driver's
node. Between them, host b loses W&B for a minute mid-run (nothing lost). The last test kills a whole
host mid-run that boots again at once (the run goes on), then cuts the other off from the head for
good (the run fails).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._egress.heads import MAX_HEAD_BYTES
from ray_wandb_nodes._hang.beacon import SUFFIX
from tests.support.cluster import node_labels, plugin_leftovers
from tests.support.env import DUMMY_KEY, WANDB_TABLES
from tests.support.hosts import Block, HostCluster, HostSpec
from tests.support.nvml import Gpu
from tests.support.relay_cotenant import LONG_HEADS, MARK, REQUESTS, SILENT, RelayProcess, relay_process
from tests.support.runs import assert_one_writer_per_label, run_of, unique, user_rows
from tests.support.training import make_callback, trainer
from tests.support.tune_runs import experiment_runs, sampled_markers
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster

POD = "raycluster-wandb-nodes-e2e-gpu-group-worker-"  # 50 characters with the pod's own suffix
HOSTS = (
    HostSpec("a", POD + "x7k2p", gpus=(Gpu(util=91, temp=64), Gpu(util=87, temp=66))),
    HostSpec("b", POD + "q9m4z", gpus=(Gpu(util=78, power_w=420.0),)),
)
# A host that dies answers nothing, so the head learns of it only from missed health checks:
# Ray's defaults (every 3 s, 5 missed, each given 10 s) took 30 s here. Every second, 5 missed,
# each given 3 s: a raylet must be silent 5 s and more before it is judged dead, which a live one
# on 2 loaded cores is not; a dead host was known dead after 4 to 20 s (whether a check fails at
# once or waits its 3 s depends on the machine's ARP entry for the host).
HOST_SYSTEM_CONFIG = {
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 5,
}
HOST_TLS = True  # the backend serves HTTPS, as W&B's cloud does (a relayed writer tunnels through CONNECT)
WORLD, STEPS, STUCK, STUCK_AT = 4, 6, 3, 2
REPORTS_KILLED = 80  # of the fit that loses hosts, every 0.5 s: it is under way at each loss
# A first step is allowed three times the limit: four ranks importing torch's lazy parts (the
# optimizer's first step) on 2 loaded cores took over 12 s, so 8 s (24 s for the first step).
HANG_TIMEOUT_S, SAMPLING_S = 8.0, 1.0


@pytest.fixture(scope="module")
def backend(hosts: HostCluster) -> WandbTestBackend:
    """The hosts' W&B backend (see the ``hosts`` fixture)."""
    return hosts.backend


def load_next_shard(release: str) -> None:
    """A data function that stops (a stalled file system, say) until the test releases it."""
    while not os.path.exists(release):
        time.sleep(0.05)  # <load_next_shard>


def hang_loop(config: dict[str, Any]) -> None:
    """Rank 3 stops at step 2 until released; from then on the ranks step every 0.2 s until the
    test asks them to finish (past ``STEPS``), so that the run sees them progress again."""
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        if step == STUCK_AT and rank == STUCK:
            Path(config["dir"], "stuck").touch()
            load_next_shard(os.path.join(config["dir"], "release"))
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)  # <all_reduce>
        optimizer.step()
        ray.train.report({"step": step})
        finish = torch.tensor([float(os.path.exists(os.path.join(config["dir"], "finish")))])
        dist.all_reduce(finish, op=dist.ReduceOp.MAX)  # every rank ends at the same step
        if step >= STEPS - 1 and finish.item():
            return
        if step > STUCK_AT:
            time.sleep(0.2)
        step += 1


def line_of(marker: str) -> int:
    for number, text in enumerate(Path(__file__).read_text().splitlines(), 1):
        if f"# <{marker}>" in text:
            return number
    raise AssertionError(marker)


def driver_wandb_vars(backend: WandbTestBackend, folder: Path) -> dict[str, str]:
    """A driver's W&B variables (``tests/conftest.py``'s ``wandb_env``) for the hosts' backend."""
    return {
        "WANDB_BASE_URL": backend.base_url, "WANDB_API_KEY": DUMMY_KEY, "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false", "WANDB_DIR": str(folder),
    }  # fmt: skip


@contextmanager
def driver_wandb_env(backend: WandbTestBackend, folder: Path) -> Iterator[None]:
    """This process's W&B environment, :func:`driver_wandb_vars` alone, for a module fixture's fit."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("WANDB_")]:
            mp.delenv(name)
        for name, value in driver_wandb_vars(backend, folder).items():
            mp.setenv(name, value)
        yield


def hang_alerts(backend: WandbTestBackend, name: str) -> list[dict[str, Any]]:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return [a for a in runs[0].alerts if a["title"].startswith("Hang")] if runs else []


@dataclass
class HungFit:
    name: str
    result: Any
    early: list[dict[str, Any]]  # hang alerts before rank 3 stopped (none, on a healthy start)
    slots: dict[str, list[str]]  # host name -> the beacon files in its /dev/shm while rank 3 was stuck
    live: dict[str, int]  # label -> its system-metric rows in the run while rank 3 was stuck


@pytest.fixture(scope="module")
def hung_fit(hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory) -> HungFit:
    """The module's fit: four ranks, two a host; rank 3 stops at step 2 until the run has its
    hang, then the ranks go on until it has the hang's end. Host a has no route to W&B (only to
    the head, as a compute node behind a login node): with ``egress="relay"`` its writer sends
    through the relay on the head, over HTTPS (CONNECT); host b reaches W&B itself."""
    from ray.train import RunConfig, ScalingConfig

    folder = tmp_path_factory.mktemp("hung-fit")  # under pytest's base temp: every host sees it
    name = unique("hosts")
    outcome: dict[str, Any] = {}
    hosts.hosts["a"].block(hosts.wandb_address, Block.NO_ROUTE)
    with driver_wandb_env(hosts.backend, folder), unblocked_after(hosts):
        callback = make_callback(hang_timeout_s=HANG_TIMEOUT_S, sampling_interval_s=SAMPLING_S, egress="relay")

        def fit() -> None:
            try:
                outcome["result"] = trainer(
                    hang_loop,
                    torch=True,
                    train_loop_config={"dir": str(folder)},
                    scaling_config=ScalingConfig(num_workers=WORLD, resources_per_worker={"CPU": 0.5}),
                    run_config=RunConfig(name=name, storage_path=str(folder / "storage"), callbacks=[callback]),
                ).fit()
            except BaseException as e:  # noqa: BLE001 - the tests see it
                outcome["result"] = e

        thread = threading.Thread(target=fit, daemon=True)
        thread.start()
        stuck = folder / "stuck"
        try:
            wait_until(lambda: stuck.exists() or "result" in outcome, 240, f"rank {STUCK} to stop")
            early = hang_alerts(hosts.backend, name)
            wait_until(lambda: hang_alerts(hosts.backend, name)[len(early) :] or "result" in outcome, 120, "the hang")
            slots = {h.name: sorted(p.name for p in h.shm.rglob(f"*{SUFFIX}")) for h in hosts.hosts.values()}
            live = {
                label: len(series.get("memory_percent", ()))
                for label, series in run_of(hosts.backend, name).system_metrics().items()
            }
            (folder / "release").touch()
            over = len(early) + 2
            wait_until(lambda: len(hang_alerts(hosts.backend, name)) >= over or "result" in outcome, 120, "its end")
        finally:
            (folder / "release").touch()
            (folder / "finish").touch()
        thread.join(240)
    assert not thread.is_alive(), "fit() did not return"
    return HungFit(name, outcome["result"], early, slots, live)


@contextmanager
def unblocked_after(hosts: HostCluster) -> Iterator[None]:
    """Every host reaches the W&B backend again on the way out (a failure too)."""
    try:
        yield
    finally:
        for host in hosts.hosts.values():
            host.unblock(hosts.wandb_address)


def hosts_head(hosts: HostCluster) -> str:
    """The head's node id (the node of no host)."""
    import ray

    workers = {h.node_id for h in hosts.hosts.values()}
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in workers)


def test_each_host_is_a_ray_node_of_its_own_hostname_and_address_that_its_name_resolves_to(hosts: HostCluster) -> None:
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 1 + len(hosts.hosts)
    for host in hosts.hosts.values():
        node = nodes[host.node_id]
        assert (node["NodeManagerHostname"], node["NodeManagerAddress"]) == (host.hostname, host.address)
        # gloo announces the address its hostname resolves to: the host's own, from its /etc/hosts
        lookup = "import socket; name = socket.gethostname(); print(name, socket.gethostbyname(name))"
        assert host.run(["python", "-c", lookup]).stdout.split() == [host.hostname, host.address]
    head = next(n for n in nodes.values() if n["NodeID"] not in {h.node_id for h in hosts.hosts.values()})
    assert (head["NodeManagerHostname"], head["NodeManagerAddress"]) == (socket.gethostname(), hosts.head_address)


def test_every_host_writes_under_its_own_label_which_keeps_its_pods_suffix(
    hosts: HostCluster, hung_fit: HungFit
) -> None:
    run = run_of(hosts.backend, hung_fit.name)
    labels = node_labels()
    assert run.labels == set(labels.values())
    assert_one_writer_per_label(run)
    for host in hosts.hosts.values():
        label = labels[host.node_id]
        # Over the label's 40 characters a hostname keeps its first 12 and its last 26: the pod's suffix.
        pod = host.hostname.rsplit("-", 1)[1]
        assert label == f"node-raycluster-w--e2e-gpu-group-worker-{pod}-{host.node_id[:6]}", label
        assert "memory_percent" in run.system_metrics()[label]
        # The writer's own hostname (wandb's run metadata) is the host's, not the machine's
        (client,) = [c for c, client_labels in run.labels_by_client().items() if label in client_labels]
        assert run.hosts[client] == host.hostname
    (primary,) = [c for c, ls in run.labels_by_client().items() if labels[hosts_head(hosts)] in ls]
    assert run.hosts[primary] == socket.gethostname()
    assert DUMMY_KEY not in hosts.log_text()  # the key reached each host's writer, and no log there
    if WANDB_TABLES:  # the nodes table's hostname column: each host's whole name
        rows = {row["node"]: row["hostname"] for row in run.tables("nodes")[-1]}
        assert {labels[h.node_id]: rows[labels[h.node_id]] for h in hosts.hosts.values()} == {
            labels[h.node_id]: h.hostname for h in hosts.hosts.values()
        }


def test_each_hosts_gpus_are_under_its_own_label(hosts: HostCluster, hung_fit: HungFit) -> None:
    run = run_of(hosts.backend, hung_fit.name)
    labels = node_labels()
    for host in hosts.hosts.values():
        assert host.gpus is not None
        series = run.system_metrics()[labels[host.node_id]]
        assert {k.split(".")[1] for k in series if k.startswith("gpu.")} == {str(i) for i in range(len(host.gpus.gpus))}
        for i, gpu in enumerate(host.gpus.gpus):
            assert set(series[f"gpu.{i}.gpu"]) == {float(gpu.util)}
            assert set(series[f"gpu.{i}.temp"]) == {float(gpu.temp)}
            assert set(series[f"gpu.{i}.powerWatts"]) == {gpu.power_w}
    assert not [k for k in run.system_metrics()[labels[hosts_head(hosts)]] if k.startswith("gpu.")]
    if WANDB_TABLES:  # each GPU's row names its host
        rows = run.tables("gpus")[-1]
        got = sorted((row["hostname"], row["gpu"]) for row in rows)
        assert got == sorted((h.hostname, i) for h in hosts.hosts.values() for i in range(len(h.gpus.gpus))), rows


def writer_of(run: Any, label: str) -> str:
    """The client id of the one writer that sends ``label``'s series."""
    (client,) = [c for c, client_labels in run.labels_by_client().items() if label in client_labels]
    return client


def test_a_host_without_a_route_to_wandb_writes_live_through_the_relay_on_the_head_and_the_run_says_each_way(
    hosts: HostCluster, hung_fit: HungFit
) -> None:
    run = run_of(hosts.backend, hung_fit.name)
    labels = node_labels()
    a, b, head = labels[hosts.hosts["a"].node_id], labels[hosts.hosts["b"].node_id], labels[hosts_head(hosts)]
    # Live: host a's series were in the run mid-run (while rank 3 was stuck), as host b's were.
    assert hung_fit.live.get(a, 0) >= 1 and hung_fit.live.get(b, 0) >= 1, hung_fit.live
    # Host a's writer reached W&B only from the head (the relay's connections, HTTPS tunnelled by
    # CONNECT: the backend's certificate is trusted end to end); host b's from b itself.
    head_side = {hosts.head_address, hosts.wandb_address}  # the machine's own addresses on the bridge
    assert hosts.backend.peers[writer_of(run, a)] <= head_side, hosts.backend.peers
    assert hosts.backend.peers[writer_of(run, b)] == {hosts.hosts["b"].address}
    # The run says which way each node's writer takes.
    assert run.config["node_egress"]["value"] == {head: "direct", a: "relay", b: "direct"}
    # Found with a relay that reached W&B: nobody is told of a node without a route.
    assert no_route_warnings(hosts, hung_fit.name) == []


def test_a_rank_hung_on_one_host_is_named_there_and_the_other_hosts_ranks_wait_for_it(
    hosts: HostCluster, hung_fit: HungFit
) -> None:
    run = run_of(hosts.backend, hung_fit.name)
    assert not isinstance(hung_fit.result, BaseException) and hung_fit.result.error is None, hung_fit.result
    labels = node_labels()
    ranks_by_label = run.config["ray_train"]["value"]["ranks_by_node"]
    host_of_rank = {r: hosts.host_of(n) for n, label in labels.items() for r in ranks_by_label.get(label, ())}
    assert sorted(host_of_rank) == list(range(WORLD)) and {h.name for h in host_of_rank.values()} == {"a", "b"}

    # Each host's /dev/shm held the beacons of its own ranks, and only those.
    beacons = {host: [rank_and_pid(slot) for slot in slots] for host, slots in hung_fit.slots.items()}
    for host in hosts.hosts.values():
        own = sorted(r for r, h in host_of_rank.items() if h is host)
        assert sorted(r for r, _ in beacons[host.name]) == own, beacons
    pid_of = {rank: pid for slots in beacons.values() for rank, pid in slots}

    assert hung_fit.early == []
    alerts = hang_alerts(hosts.backend, hung_fit.name)
    assert [(a["title"], a["severity"]) for a in alerts] == [
        (f"Hang: rank {STUCK} stopped", "ERROR"),
        (f"Hang over: ranks 0-{WORLD - 1} progress again", "INFO"),
    ], alerts
    text = alerts[0]["text"]
    stuck_label = labels[host_of_rank[STUCK].node_id]
    shard, reduce = line_of("load_next_shard"), line_of("all_reduce")
    assert re.match(rf"ranks 0-2 wait in all_reduce( #\d+)? \(test_hosts.py:{reduce}\); rank {STUCK} ", text), text
    assert f"in load_next_shard (test_hosts.py:{shard})" in text.splitlines()[0]
    assert f"rank {STUCK} on {stuck_label}" in text
    # Every rank's stacks, each taken on its own host: its file names the host's label and the pid
    # its beacon has there (each host numbers its own processes).
    for rank, host in host_of_rank.items():
        first = run.files[f"hangs/hang-1/rank-{rank}.txt"].decode().splitlines()[0]
        assert first.startswith(f"rank {rank} (pid {pid_of[rank]}) on {labels[host.node_id]}"), first
    assert "load_next_shard" in run.files[f"hangs/hang-1/rank-{STUCK}.txt"].decode()
    assert "all_reduce" in run.files["hangs/hang-1/rank-0.txt"].decode()
    steps = [row["step"] for row in user_rows(run)]
    assert steps == list(range(len(steps))) and len(steps) >= STEPS
    assert [c.exit_code for c in run.completes] == [0]


def rank_and_pid(slot: str) -> tuple[int, int]:
    """The rank and pid of a beacon file's name (``rank-<rank>.<pid>.slot``)."""
    match = re.fullmatch(rf"rank-(\d+)\.(\d+){re.escape(SUFFIX)}", slot)
    assert match, slot
    return int(match[1]), int(match[2])


# Nodes without a route to W&B ---------------------------------------------------------------------
# With egress="relay", the hung fit's host a writes live through the relay (its test is above) and the
# fit that loses hosts, where every host reaches W&B, sends nothing through it (below). Here the
# default: host a's way to W&B refused at once, host b's silently dropped; each writes offline and
# is synced into the run at its end. The backend serves HTTPS (HOST_TLS) throughout.
REPORT_S = 0.5
# What the hold is told apart from: before the wiring, the writers of hosts without a route held
# training's start the whole startup wait (STARTUP_WAIT_S, 30 s), then said so ("were not all
# ready"). Now a dropped host's check waits its bound (DEFAULT_TIMEOUT_S) and its writer starts
# offline (training's start held 6.4-7.4 s in all on a quiet machine, 23.8 s with two test streams
# on 2 cores): the hold ends on those starts, before that wait, and without its warning. No
# ceiling tighter than the wait it replaced: a start slowed by load is not the plugin waiting.


def egress_loop(config: dict[str, Any]) -> None:
    """Report every 0.5 s until the step the test writes into ``stop`` (ranks read it every step:
    both report as often); each rank notes when its train function started, and the step it
    reported last (``step-<rank>``, written whole, then renamed)."""
    import ray.train

    folder = Path(config["dir"])
    rank = ray.train.get_context().get_world_rank()
    (folder / f"started-{rank}").write_text(repr(time.time()))
    step = 0
    while True:
        ray.train.report({"step": step})
        (folder / f"step-{rank}.tmp").write_text(str(step))
        (folder / f"step-{rank}.tmp").rename(folder / f"step-{rank}")
        stop = folder / "stop"
        if stop.exists() and step >= int(stop.read_text()):
            break
        time.sleep(REPORT_S)
        step += 1
    (folder / f"ended-{rank}").write_text(repr(time.time()))


@dataclass
class EgressFit:
    name: str
    result: Any
    folder: Path
    seen: dict[str, float]  # what the test saw while the fit ran (time.time()): "warning", "relayed", ...
    labels_then: set[str]  # the run's labels when the test saw the warning (or the relayed samples)
    started: float  # time.time() when the first rank's train function started
    trained: float  # ... and when the last one returned
    ended: float  # ... and when fit() returned
    held_s: float  # training's start held: the ranks' train function after their workers started


def stop_at(folder: Path, more: int) -> None:
    """The ranks stop ``more`` reports past the last either reported (written whole, then
    renamed). Counted from the ranks' own steps, not the run's rows: those land in the backend
    seconds late on a loaded machine, and a stop counted from them may be a step already past."""
    steps = [int(p.read_text()) for p in folder.glob("step-[0-9]")]
    tmp = folder / "stop.tmp"
    tmp.write_text(str(max(steps, default=0) + more))
    tmp.rename(folder / "stop")


def train_workers_started() -> float:
    """When the fit's train workers last started (GCS's actor table: the latest RayTrainWorker's
    start), in seconds since the epoch."""
    import ray._private.state as state

    starts = [a["StartTime"] for a in state.actors().values() if a["ActorClassName"] == "RayTrainWorker"]
    return max(starts) / 1000.0


@contextmanager
def egress_fit(hosts: HostCluster, folder: Path, name: str, **options: Any) -> Iterator[dict[str, Any]]:
    """The module's egress fit (two ranks, one a host) running on a thread while the body runs;
    then the ranks are stopped and the fit waited for (its result in the yielded dict)."""
    from ray.train import RunConfig, ScalingConfig

    outcome: dict[str, Any] = {}
    with driver_wandb_env(hosts.backend, folder):
        callback = make_callback(sampling_interval_s=SAMPLING_S, **options)

        def fit() -> None:
            try:
                outcome["result"] = trainer(
                    egress_loop,
                    torch=False,
                    train_loop_config={"dir": str(folder)},
                    scaling_config=ScalingConfig(num_workers=2),
                    run_config=RunConfig(name=name, storage_path=str(folder / "storage"), callbacks=[callback]),
                ).fit()
            except BaseException as e:  # noqa: BLE001 - the tests see it
                outcome["result"] = e
            outcome["ended"] = time.time()

        thread = threading.Thread(target=fit, daemon=True)
        thread.start()
        outcome["thread"] = thread
        try:
            yield outcome
        finally:
            if not (folder / "stop").exists():
                stop_at(folder, 2)
            thread.join(240)
    assert not thread.is_alive(), "fit() did not return"
    started = [folder / f"started-{r}" for r in range(2)]
    assert all(p.exists() for p in started), f"the ranks never started: {outcome['result']!r}"
    outcome["started"] = min(float((folder / f"started-{r}").read_text()) for r in range(2))
    outcome["trained"] = max(float((folder / f"ended-{r}").read_text()) for r in range(2))
    outcome["held_s"] = outcome["started"] - train_workers_started()


def egress_result(name: str, folder: Path, o: dict[str, Any], seen: dict[str, float], labels: set[str]) -> EgressFit:
    return EgressFit(name, o["result"], folder, seen, labels, o["started"], o["trained"], o["ended"], o["held_s"])


def no_route_warnings(hosts: HostCluster, name: str) -> list[str]:
    """The run's no-route warnings, each once: the controller's stderr and Ray Train's own log
    file both hold each line the controller logs."""
    lines = [line for line in hosts.log_text().splitlines() if "cannot reach W&B" in line and name in line]
    return list(dict.fromkeys(line[line.index("ray_wandb_nodes:") :] for line in lines))


def run_id_of(backend: WandbTestBackend, name: str) -> str | None:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return runs[0].run_id if runs else None


@pytest.fixture(scope="module")
def offline_fit(hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory) -> EgressFit:
    """The default: host a without a route to W&B (refused at once), host b whose packets to W&B
    vanish; the test waits for the warning, notes the run's labels then, and lets the ranks end."""
    folder = tmp_path_factory.mktemp("offline-fit")
    name = unique("no-route")
    a, b = hosts.hosts["a"], hosts.hosts["b"]
    a.block(hosts.wandb_address, Block.NO_ROUTE)
    b.block(hosts.wandb_address, Block.DROPPED)
    seen: dict[str, float] = {}
    labels_then: set[str] = set()
    try:
        with egress_fit(hosts, folder, name) as outcome:
            thread = outcome["thread"]
            wait_until(lambda: no_route_warnings(hosts, name) or not thread.is_alive(), 120, "the no-route warning")
            seen["warning"] = time.time()
            runs = [r for r in hosts.backend.runs.values() if r.display_name == name]
            labels_then = set(runs[0].labels) if runs else set()
            stop_at(folder, 4)
    finally:
        a.unblock(hosts.wandb_address)
        b.unblock(hosts.wandb_address)
    return egress_result(name, folder, outcome, seen, labels_then)


def sample_times(run: Any, label: str) -> list[float]:
    """When each of ``label``'s system-metric samples was taken (wandb's ``_timestamp``), in order."""
    suffix = f"/l:{label}"
    return sorted(row["_timestamp"] for row in run.events if any(k.endswith(suffix) for k in row))


def test_hosts_without_a_route_to_wandb_cost_seconds_are_named_at_once_and_reach_the_run_at_its_end(
    hosts: HostCluster, offline_fit: EgressFit
) -> None:
    from ray_wandb_nodes._run.train_run import STARTUP_WAIT_S

    fit = offline_fit
    assert not isinstance(fit.result, BaseException) and fit.result.error is None, fit.result
    labels = node_labels()
    a, b = (labels[hosts.hosts[h].node_id] for h in "ab")
    warnings = no_route_warnings(hosts, fit.name)
    # One warning, while the run went on, naming both hosts, what each found, and the option.
    assert len(warnings) == 1 and fit.seen["warning"] < fit.ended, (warnings, fit.seen, fit.ended)
    (warning,) = warnings
    assert f"{a} ({hosts.wandb_address}:" in warning and "unreachable (Network is unreachable)" in warning
    assert f"{b} ({hosts.wandb_address}:" in warning and "timed out" in warning
    assert 'egress="relay" sends them live' in warning
    assert not {a, b} & fit.labels_then  # offline: nothing of theirs reached the run while it ran
    # Training's start was held by the checks and the offline starts, not the startup wait.
    assert fit.held_s < STARTUP_WAIT_S, f"training's start held {fit.held_s:.1f}s"
    assert "were not all ready" not in hosts.log_text()
    # At the end, each host's series are in the run, under its label, from one writer each.
    run = run_of(hosts.backend, fit.name)
    assert run.labels == {a, b, labels[hosts_head(hosts)]}
    assert_one_writer_per_label(run)
    for label in (a, b):
        times = sample_times(run, label)
        # From before training started (the hold waits for each writer's first sample) to its end.
        assert times[0] <= fit.started and times[-1] >= fit.trained - SAMPLING_S, (label, times[:3], times[-3:])
    assert [c.exit_code for c in run.completes] == [0]
    assert not (fit.folder / "ray_wandb_nodes" / run.run_id).exists()  # synced: nothing left behind
    print(f"no-route fit: training's start held {fit.held_s:.1f}s")


# Tune: the relay on the driver's node ------------------------------------------------------------
def test_a_tune_trial_on_a_host_without_a_route_writes_live_through_the_relay_on_the_drivers_node(
    hosts: HostCluster, tmp_path: Path
) -> None:
    """Tune's driver starts the relay as the Train controller does: one trial a host, host a
    without a route to W&B (only to the head); its trial's run gets a's series while it runs,
    sent from the head, over HTTPS (CONNECT), and b's trial's run b's, from b itself. The driver
    is a process of its own (``tests/support/tune_driver.py``): Tune's primary writers run there,
    and trust the test's authority as the head's processes do."""
    name = unique("tune-relay")
    a, b = hosts.hosts["a"], hosts.hosts["b"]
    assert hosts.certificate is not None  # HOST_TLS
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "RAY_ADDRESS"}
    env.update(driver_wandb_vars(hosts.backend, tmp_path))
    env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = str(hosts.certificate.ca)
    a.block(hosts.wandb_address, Block.NO_ROUTE)
    try:
        with sampled_markers(hosts.backend, name, tmp_path / "sampled") as sampled:
            driver = subprocess.run(
                [
                    sys.executable, "-m", "tests.support.tune_driver", hosts.address, name,
                    str(tmp_path / "storage"), sampled, f"sampling_interval_s={SAMPLING_S}", 'egress="relay"',
                ],
                env=env, capture_output=True, text=True, timeout=400,
            )  # fmt: skip
    finally:
        a.unblock(hosts.wandb_address)
    trials = [json.loads(line) for line in driver.stdout.splitlines() if line.startswith("{")]
    assert driver.returncode == 0 and len(trials) == 2, (
        driver.returncode,
        driver.stdout[-3000:],
        driver.stderr[-3000:],
    )
    assert [t["error"] for t in trials] == [None, None], trials
    labels = node_labels()
    runs = experiment_runs(hosts.backend, name)
    by_node = {t["node_id"]: runs[t["trial_id"]] for t in trials}
    assert set(by_node) == {a.node_id, b.node_id}, by_node  # one trial a host (one CPU each, none on the head)
    for host in (a, b):
        run, label = by_node[host.node_id], labels[host.node_id]
        assert run.labels == {label} and run.exit_codes == [0], (host.name, run.labels, run.exit_codes)
    # Host a's writer reached W&B only from the head (the relay), host b's from b itself.
    peers = hosts.backend.peers
    assert peers[writer_of(by_node[a.node_id], labels[a.node_id])] <= {hosts.head_address, hosts.wandb_address}, peers
    assert peers[writer_of(by_node[b.node_id], labels[b.node_id])] == {b.address}, peers
    assert "cannot reach W&B" not in driver.stderr  # found with a relay that reached W&B: nobody is told
    wait_until(lambda: plugin_leftovers() == ([], []), 30, "the plugin's actors to go")  # the relay's too


# A node cut off from W&B mid-run ------------------------------------------------------------------
CUT_S = 60.0  # the case: a node's way to W&B gone for a minute (a switch reboots, a firewall reloads)


def sample_count(backend: WandbTestBackend, name: str, label: str) -> int:
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return len(sample_times(runs[0], label)) if runs else 0


def test_a_host_cut_off_from_wandb_for_a_minute_mid_run_loses_no_sample_and_raises_no_alert(
    hosts: HostCluster, tmp_path: Path
) -> None:
    """Both hosts write live; then host b's packets to W&B vanish for a minute (a silent drop: the
    hardest case, each request waits on its timeout) and come back. Host b's writer keeps sampling
    and sends what it held once the way is back: the run has every sample of b's, as dense as
    host a's (which was never cut) over the same minute, and the plugin said nothing of it."""
    name = unique("cut-off")
    b = hosts.hosts["b"]
    with egress_fit(hosts, tmp_path, name) as outcome:
        thread = outcome["thread"]
        labels = node_labels()
        la, lb = labels[hosts.hosts["a"].node_id], labels[b.node_id]
        wait_until(
            lambda: sample_count(hosts.backend, name, lb) >= 2 or not thread.is_alive(), 120, "b's samples, live"
        )
        assert thread.is_alive(), outcome
        with unblocked_after(hosts):
            b.block(hosts.wandb_address, Block.DROPPED)
            cut = time.time()
            time.sleep(CUT_S / 2)  # the fault's length is the case under test, not a margin
            halfway = sample_count(hosts.backend, name, lb)
            time.sleep(CUT_S / 2)
            cut_end = sample_count(hosts.backend, name, lb)
            b.unblock(hosts.wandb_address)
        back = time.time()
        # Once the way is back, what b held reaches the run: a sample taken after the cut ended.
        wait_until(
            lambda: any(t > back for t in sample_times(run_of(hosts.backend, name), lb)) or not thread.is_alive(),
            240,
            "b's samples after the cut",
        )
        caught_up = time.time()
        stop_at(tmp_path, 2)
    result = outcome["result"]
    assert not isinstance(result, BaseException) and result.error is None, result
    run = run_of(hosts.backend, name)
    # The cut was real: nothing of b's arrived in its second half (a request b had sent just
    # before it may have landed in its first seconds).
    assert cut_end == halfway, (halfway, cut_end)
    a_times, b_times = sample_times(run, la), sample_times(run, lb)

    def within(times: list[float]) -> list[float]:
        return [t for t in times if cut <= t <= back]

    # Every sample of b's over the minute is in the run: as many as host a's, whose writer samples
    # as often on the same loaded machine and was never cut (one either way: where each tick fell).
    assert len(within(b_times)) >= len(within(a_times)) - 1, (len(within(b_times)), len(within(a_times)))
    assert max(gaps(b_times)) <= max(gaps(a_times)) + SAMPLING_S, (max(gaps(b_times)), max(gaps(a_times)))
    assert_one_writer_per_label(run)
    assert run.alerts == [], run.alerts  # the plugin's view of b (its node, its writer) never wavered
    print(
        f"cut off {CUT_S:.0f}s: b {len(within(b_times))} samples over it, a {len(within(a_times))}; "
        f"largest gap b {max(gaps(b_times)):.1f}s, a {max(gaps(a_times)):.1f}s; "
        f"b's first sample after the cut in the run {caught_up - back:.1f}s after it"
    )
    assert [c.exit_code for c in run.completes] == [0]


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def report_loop(config: dict[str, Any]) -> None:
    import ray.train

    for step in range(config["steps"]):
        time.sleep(0.5)
        ray.train.report({"step": step})


class Timeline:
    """When each awaited thing was first seen, in seconds from a start."""

    def __init__(self) -> None:
        self.start, self.at = time.monotonic(), dict[str, float]()

    def note(self, what: str, seen: bool) -> bool:
        if seen and what not in self.at:
            self.at[what] = time.monotonic() - self.start
        return seen

    def __str__(self) -> str:
        return ", ".join(f"{what} after {t:.1f} s" for what, t in self.at.items())


def node_row(run: Any, label: str) -> dict[str, Any] | None:
    """A node's row in the run's last ``nodes`` table (its state: lost, left, ok)."""
    tables = run.tables("nodes") if WANDB_TABLES else []
    return next((row for row in tables[-1] if row["node"] == label), None) if tables else None


def node_alive(node_id: str) -> bool:
    import ray

    return any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id)


def rows_and_alerts(backend: WandbTestBackend, name: str) -> tuple[int, list[str]]:
    """How many rows training reported to the run so far, and the titles of its alerts."""
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return (len(user_rows(runs[0])), [a["title"] for a in runs[0].alerts]) if runs else (0, [])


# A co-tenant floods the relay, then the relay dies ------------------------------------------------
# One fit with egress="relay": host a without a route to W&B writes through the relay on the head.
# A co-tenant on host b (a node of the run: the relay closes any other peer without a word, so the
# flood must come from a node's address) floods it without the token; then the relay's process is
# killed. The bounds of what the flood may cost the relay, each from the relay's own bounds:
# - Memory. A relay that keeps nothing of a refused request reaches a plateau under a flood: its first
#   one raises its peak (asyncio's objects for 6,000 sockets accepted in a burst, the allocator's
#   arenas, which keep freed memory for reuse), and the same flood again finds that memory free.
#   One that kept what it read of each long head (16 KiB, MAX_HEAD_BYTES, of LONG_HEADS = 3,000 a
#   round: 47 MiB) would raise its peak by 94 MiB over two more rounds. The bound on those two: half
#   of that. What it must stand clear of is the noise of a Ray worker's process keeping nothing:
#   its peak rose 0.2 to 19 MiB over two rounds after the first (quiet and under CI's load), and
#   10 MiB over six, in steps of up to 14 MiB at a time: arenas, the worker's own threads. A leak
#   of a whole head (16 KiB a request) fails here surely; one of its host alone (8 KiB) costs about
#   the bound and may pass, a smaller one surely: that a flood leaves no state in the relay is
#   tests/unit/egress/test_relay_cotenant.py's (no string of a refused host among its objects).
# - Its log: admit.LINES (10) refusal lines a minute (each a window from its first line), so at most
#   10 x (whole minutes of the relay's life + 1); no host a co-tenant asked for (it has no token).
FLOOD_ROUNDS = 3
RELAY_FLOOD_GROWTH_KIB = LONG_HEADS * MAX_HEAD_BYTES // 1024 * (FLOOD_ROUNDS - 1) // 2


def relayed_after(backend: WandbTestBackend, name: str, label: str, moment: float) -> bool:
    """Whether the run has a sample of ``label``'s taken after ``moment`` (time.time())."""
    runs = [r for r in backend.runs.values() if r.display_name == name]
    return bool(runs) and any(t > moment for t in sample_times(runs[0], label))


class Cotenant:
    """``tests/support/relay_cotenant.py`` running inside ``host``: its JSON lines as they come."""

    def __init__(self, host: Any, relay: RelayProcess) -> None:
        argv = ["python", "-m", "tests.support.relay_cotenant", relay.host, str(relay.port)]
        self.proc = subprocess.Popen(
            host.command(argv), env=host.environment(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def next(self) -> None:
        """One more round."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("next\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        """Its sockets closed, its process ended (a failure too)."""
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)


def relay_lost_warnings(hosts: HostCluster) -> list[str]:
    """The relay's death warnings, each once (the controller's stderr and Ray Train's log file)."""
    lines = [line for line in hosts.log_text().splitlines() if "without a route to W&B ended mid-run" in line]
    return list(dict.fromkeys(line[line.index("ray_wandb_nodes:") :] for line in lines))


def test_a_cotenant_flooding_the_relay_leaves_its_writer_live_and_the_relays_death_loses_nothing(
    hosts: HostCluster, tmp_path: Path
) -> None:
    """Host a writes through the relay. A co-tenant on host b sends 4,000 requests without the
    token, each for a host of its own, and holds 6,000 silent sockets; meanwhile a's tunnels are
    cut (``ss -K``) so that its writer must open new ones through the flooded relay: its samples
    still arrive, and the relay's memory and log stay within bounds derived from its own. Then
    the relay's process is killed: the run goes on and ends, host a is named once, and its series,
    sent before the death and kept on its node after it, are in the run at its end."""
    name = unique("relay-flood")
    a, b = hosts.hosts["a"], hosts.hosts["b"]
    head_init = int((hosts.folder / "head.pid").read_text())
    born = time.monotonic()  # before the relay starts: its life, for the log's bound
    a.block(hosts.wandb_address, Block.NO_ROUTE)
    with unblocked_after(hosts), egress_fit(hosts, tmp_path, name, egress="relay") as outcome:
        thread = outcome["thread"]
        labels = node_labels()
        la, lb = labels[a.node_id], labels[b.node_id]
        wait_until(lambda: sample_count(hosts.backend, name, la) >= 2 or not thread.is_alive(), 120, "a's samples")
        assert thread.is_alive(), outcome
        relay = wait_until(lambda: relay_process(head_init, hosts.head_address), 60, "the relay's process")
        rss_before = relay.status("VmRSS")
        flood_began = time.time()
        cotenant = Cotenant(b, relay)
        try:
            peaks = []
            for n in range(1, FLOOD_ROUNDS + 1):
                wait_until(lambda n=n: len(cotenant.lines) >= n or cotenant.proc.poll() is not None, 300, f"flood {n}")
                assert len(cotenant.lines) == n, (cotenant.lines, cotenant.proc.returncode)
                peaks.append(relay.status("VmHWM"))  # the relay let go of every socket of this round
                if n < FLOOD_ROUNDS:
                    cotenant.next()
                if n == 1:  # a's tunnels cut as the second flood begins: its writer opens new ones
                    cut = time.time()
                    subprocess.run(
                        ["ss", "-K", "state", "established", "src", f"{relay.host}:{relay.port}", "dst", a.address],
                        capture_output=True, check=False,
                    )  # fmt: skip
            wait_until(
                lambda: relayed_after(hosts.backend, name, la, cut) or not thread.is_alive(),
                120,
                "a's samples taken after its tunnels were cut in the flood",
            )
            assert thread.is_alive(), outcome
        finally:
            cotenant.stop()
        log = relay.log(hosts.folder / "ray")
        lived_min = (time.monotonic() - born) / 60
        # The relay's death: its process killed, as the OOM killer or a crash would.
        killed = time.time()
        os.kill(relay.pid, signal.SIGKILL)
        warnings = wait_until(lambda: relay_lost_warnings(hosts) or not thread.is_alive(), 120, "the relay's death")
        # The writer samples every SAMPLING_S and finishes only at the run's end: four more
        # reports (0.5 s each) from here give it samples after the death, kept on its node.
        stop_at(tmp_path, 4)
    result = outcome["result"]
    assert not isinstance(result, BaseException) and result.error is None, result

    # The floods: every request refused, every silent socket taken, then let go by the relay.
    for flooded in cotenant.lines:
        answers = flooded["answers"]
        assert sum(answers.values()) == REQUESTS and flooded["held"] == flooded["closed_by_relay"] == SILENT, flooded
        assert all(k.startswith(("HTTP/1.1 407 ", "HTTP/1.1 400 ", "HTTP/1.1 431 ")) for k in answers), answers
        too_large = sum(n for k, n in answers.items() if k.startswith("HTTP/1.1 431 "))
        assert too_large == LONG_HEADS, answers  # the relay read 16 KiB of each: the memory bound's premise
    growth = peaks[-1] - peaks[0]
    assert growth <= RELAY_FLOOD_GROWTH_KIB, f"the relay's peak grew {growth} KiB over {FLOOD_ROUNDS - 1} more floods"
    refusals = [line for line in log.splitlines() if "relay: refused" in line]
    assert 1 <= len(refusals) <= 10 * (int(lived_min) + 1), refusals
    # A host asked for is shown escaped and cut to 64 characters: a line is "relay: refused " (15),
    # the host quoted with its ellipsis (69), the reason (at most 20) and the count left out
    # ("; N refusals before this one not logged": under 50), never the 8 KiB asked for.
    assert [line for line in refusals if MARK in line] and max(map(len, refusals)) < 160, refusals

    # The death: one warning naming a; the run ended, its config saying a wrote offline.
    assert len(warnings) == 1 and la in warnings[0] and "brought into the run when it ends" in warnings[0], warnings
    run = run_of(hosts.backend, name)
    assert [c.exit_code for c in run.completes] == [0]
    assert run.config["node_egress"]["value"][la] == "offline", run.config["node_egress"]
    # a's series from two clients, both on the head: its writer's through the relay, and its
    # offline run's sync at the end (with what was sent already); every other label from one.
    writers = run.labels_by_client()
    a_clients = [c for c, labels in writers.items() if la in labels]
    assert 1 <= len(a_clients) <= 2, writers
    assert set().union(*(hosts.backend.peers[c] for c in a_clients)) <= {hosts.head_address, hosts.wandb_address}
    others = [label for labels in writers.values() for label in labels if label != la]
    assert sorted(others) == sorted(set(others)), writers
    left = tmp_path / "ray_wandb_nodes" / run.run_id
    assert not left.exists(), (left / "index.json").read_text()  # synced: nothing left behind
    a_times, b_times = sample_times(run, la), sample_times(run, lb)
    # Nothing lost: a's series from before the flood to after the death, as dense as b's (which
    # wrote straight the whole run, on the same loaded machine). What it had sent through the relay
    # is synced again with the rest, at the same timestamps: counted once here.
    twice = len(a_times) - len(set(a_times))
    a_times = sorted(set(a_times))
    assert a_times[0] < flood_began and any(t > killed for t in a_times), (a_times[:3], a_times[-3:], killed)
    assert max(gaps(a_times)) <= max(gaps(b_times)) + SAMPLING_S, (max(gaps(a_times)), max(gaps(b_times)))
    wait_until(lambda: plugin_leftovers() == ([], []), 30, "the plugin's actors to go")
    print(
        f"relay flood: {FLOOD_ROUNDS} rounds of {REQUESTS} refused ({dict(answers)}) and {SILENT} silent sockets; "
        f"the relay's RSS {rss_before / 1024:.1f} MiB before, its peak after each round "
        f"{', '.join(f'{p / 1024:.1f}' for p in peaks)} MiB; {len(refusals)} refusal lines in {lived_min:.1f} min; "
        f"a's {len(a_times)} samples ({twice} of them twice, from {len(a_clients)} clients), b's {len(b_times)}"
    )


@pytest.mark.slow  # the last of the module: host a stays cut off
def test_hosts_killed_or_cut_off_mid_run_are_named_lost_the_rebooted_one_writes_anew_and_the_run_ends_once(
    hosts: HostCluster, tmp_path: Path
) -> None:
    """Host b dies after three reports and boots again at once: Train restarts the ranks (its one
    failure allowed), one on the rebooted b, a new Ray node. Then host a is cut off from the head
    for good (a partition: a lives on and still reaches W&B): Ray judges it dead, no failure is
    left, so the fit fails, and the run ends once, failed. With ``egress="relay"``, where every
    host reaches W&B itself: the relay carries nothing, and stops with the run."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    backend, (a, b) = hosts.backend, (hosts.hosts["a"], hosts.hosts["b"])
    name = unique("hosts-die")
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer(
                report_loop,
                torch=False,
                train_loop_config={"steps": REPORTS_KILLED},
                scaling_config=ScalingConfig(num_workers=2),
                run_config=RunConfig(
                    name=name,
                    storage_path=str(tmp_path),
                    callbacks=[make_callback(egress="relay")],
                    failure_config=FailureConfig(max_failures=1),
                ),
            ).fit()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome["result"] = e

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    wait_until(lambda: rows_and_alerts(backend, name)[0] >= 3 or not thread.is_alive(), 120, "three reports")
    assert thread.is_alive(), outcome
    labels = node_labels()
    lost_b, lost_a = labels[b.node_id], labels[a.node_id]

    b_dies = Timeline()
    b.kill()
    rows_then = rows_and_alerts(backend, name)[0]
    b.start()  # on this (the main) thread: a host dies with the thread that started it
    b_dies.note("b was back", True)

    def restarted() -> bool:  # three reports of the restarted ranks, one on the rebooted b
        rows, titles = rows_and_alerts(backend, name)
        b_dies.note("Ray knew b dead", not node_alive(b.past_node_ids[-1]))
        b_dies.note("b's alert", f"Node lost: {lost_b}" in titles)
        return rows >= rows_then + 3 or not thread.is_alive()

    wait_until(restarted, 180, "the ranks restarted on the rebooted host b to report")
    assert thread.is_alive(), outcome
    b_dies.note("the restarted ranks reported", True)

    a_dies = Timeline()
    a.cut_off_from_head()
    while thread.is_alive() and time.monotonic() - a_dies.start < 240:
        a_dies.note("Ray knew a dead", not node_alive(a.node_id))
        a_dies.note("a's alert", f"Node lost: {lost_a}" in rows_and_alerts(backend, name)[1])
        time.sleep(0.1)
    a_dies.note("fit() returned", not thread.is_alive())
    print(f"host b killed and rebooted: {b_dies}; host a cut off from the head: {a_dies}")
    assert not thread.is_alive(), "fit() hung"

    result = outcome["result"]
    error = result if isinstance(result, BaseException) else result.error
    assert error is not None and "ray_wandb_nodes" not in repr(error)
    run = run_of(backend, name)
    # The node alerts (each failed attempt has an alert of its own too: the failures' tests say what).
    lost = [a for a in run.alerts if a["title"].startswith("Node lost")]
    assert (lost[0]["title"], lost[0]["severity"]) == (f"Node lost: {lost_b}", "ERROR"), b_dies
    assert f"(host {b.hostname}, rank " in lost[0]["text"]
    # The rebooted host is a new Ray node: the same hostname, a label of its own, in the same run.
    rebooted = next(label for label in run.labels if label not in (lost_a, lost_b) and "-worker-q9m4z-" in label)
    assert rebooted == node_labels()[b.node_id]
    assert_one_writer_per_label(run)
    if WANDB_TABLES:
        assert {label: (node_row(run, label) or {}).get("state") for label in (lost_b, rebooted)} == {
            lost_b: "lost",
            rebooted: "ok",
        }
    assert len(run.completes) == 1 and run.exit_codes[0] not in (0, None)
    # Every host's writer went straight to W&B, each from its own address, as the run's config says.
    ways = run.config["node_egress"]["value"]
    assert {label: ways.get(label) for label in (lost_a, lost_b, rebooted)} == dict.fromkeys(
        (lost_a, lost_b, rebooted), "direct"
    )
    assert set(ways.values()) == {"direct"}, ways
    for label, host in ((lost_a, a), (lost_b, b), (rebooted, b)):
        assert backend.peers[writer_of(run, label)] == {host.address}, (label, backend.peers)
    wait_until(lambda: plugin_leftovers() == ([], []), 30, "the plugin's actors to go")  # the relay's too
    # Host a's loss is named though the fit may end before the fleet's next node listing (every
    # 3 s): the run's end reads the listing afresh.
    assert [a["title"] for a in lost] == [f"Node lost: {lost_b}", f"Node lost: {lost_a}"], a_dies
