"""End to end, memory kills where the hosts have memory limits (``tests/support/hosts.py``: each
host a memory cgroup of its own, seen inside as a container sees its own): a rank that grows until
the kernel's OOM killer ends it, and one that Ray's memory monitor ends.

Three one-CPU hosts: ``a`` without a limit; ``k`` with ``LIMIT`` and Ray's memory monitor off
(``RAY_memory_monitor_refresh_ms=0``: the monitor exists to act before the kernel does, at 95%
of the limit by default, so with it on the kernel's OOM killer is never the one that kills); ``m``
with ``LIMIT`` and the monitor's threshold at ``THRESHOLD``. Each fit is two ranks over gloo: the
one host of the pair with a limit holds the rank that grows (by its hostname), the third host's CPU
is held by an actor so that the ranks go where the test wants.

``LIMIT``: a host's raylet, its Ray agents, an idle worker, the plugin's logger (with wandb-core)
and a rank with torch imported took PEAK_IDLE at most on a healthy fit here (the first test
prints it); the limit leaves a rank GROW_ROOM above that to grow into before the kernel ends it.
The ranks grow by ``CHUNK`` a step, touched (a page at a time), and never past ``MAX_GROWTH``
(the cgroup's limit ends them first; the bound keeps a machine without the limit safe).
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import node_labels
from tests.support.hosts import Host, HostCluster, HostSpec, memory_limits_unsupported
from tests.support.runs import failure_alerts, run_of, unique
from tests.support.training import fit_within, make_callback, trainer
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster

MIB, GIB = 1024**2, 1024**3
PEAK_IDLE = GIB  # see the module's docstring: 0.63 GiB measured, with room
GROW_ROOM = GIB
LIMIT = PEAK_IDLE + GROW_ROOM
THRESHOLD = 0.75  # of LIMIT: 0.5 GiB above PEAK_IDLE, 0.5 GiB (two seconds of growth) below the limit
CHUNK = 64 * MIB
MAX_GROWTH = LIMIT + GIB
STEP_S = 0.25  # Ray's memory monitor looks every 250 ms: a step's growth is seen before the next
HOSTS = (
    HostSpec("a", "rwn-mem-a"),
    HostSpec("k", "rwn-mem-kernel", memory_bytes=LIMIT, env={"RAY_memory_monitor_refresh_ms": "0"}),
    HostSpec("m", "rwn-mem-monitor", memory_bytes=LIMIT, env={"RAY_memory_usage_threshold": str(THRESHOLD)}),
)


@pytest.fixture(scope="module")
def backend(hosts: HostCluster) -> WandbTestBackend:
    return hosts.backend


@pytest.fixture(scope="module", autouse=True)
def limits_supported() -> None:
    reason = memory_limits_unsupported()
    if reason:
        pytest.skip(reason)


def grow_loop(config: dict[str, Any]) -> None:
    """Two ranks step together over gloo; from step ``grow_after`` on, the rank on the host named
    ``grow_on`` grows by ``CHUNK`` a step (in every attempt), until killed or ``steps`` end."""
    import ray.train
    import torch
    import torch.distributed as dist

    rank = ray.train.get_context().get_world_rank()
    grows = socket.gethostname() == config["grow_on"]
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    held: list[bytearray] = []
    for step in range(config["steps"]):
        loss = model(torch.ones(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
        optimizer.step()
        ray.train.report({"step": step})
        if grows and step >= config["grow_after"] and len(held) * CHUNK < MAX_GROWTH:
            Path(config["dir"], f"grower-{rank}-{os.getpid()}").touch()
            chunk = bytearray(CHUNK)
            chunk[::4096] = b"\1" * (CHUNK // 4096)  # every page touched: resident
            held.append(chunk)
        time.sleep(STEP_S)


@pytest.fixture
def hold() -> Iterator[Callable[[Host], None]]:
    """Hold a host's CPU by an actor for the test (let go on the way out): the ranks go elsewhere."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1)
    class Hold:
        def ready(self) -> bool:
            return True

    actors: list[Any] = []

    def hold(host: Host) -> None:
        actor = Hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(host.node_id, soft=False)).remote()
        ray.get(actor.ready.remote(), timeout=60)
        actors.append(actor)

    try:
        yield hold
    finally:
        for actor in actors:
            ray.kill(actor)


def fit(hosts: HostCluster, folder: Path, name: str, grow_on: Host, *, steps: int, grow_after: int,
        max_failures: int = 0) -> Any:  # fmt: skip
    """The two-rank fit, to its end (bounded); its result or the exception it raised."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    made = trainer(
        grow_loop,
        torch=True,
        train_loop_config={"dir": str(folder), "grow_on": grow_on.hostname, "steps": steps, "grow_after": grow_after},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=str(folder / "storage"),
            callbacks=[make_callback(sampling_interval_s=1.0)],
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    return fit_within(made, 300)


def peak(host: Host) -> int:
    folder = host.cgroup
    assert folder is not None
    name = "memory.max_usage_in_bytes" if (folder / "memory.max_usage_in_bytes").exists() else "memory.peak"
    return int((folder / name).read_text())


def test_a_healthy_fit_on_memory_limited_hosts_says_no_memory(
    hosts: HostCluster, hold: Callable[[Host], None], tmp_path: Path
) -> None:
    """The same fit without growth: it succeeds, no failure alert, and a host's peak is below
    what the limit was derived from (printed: the figure behind ``PEAK_IDLE``)."""
    k = hosts.hosts["k"]
    hold(hosts.hosts["m"])
    name = unique("mem-healthy")
    result = fit(hosts, tmp_path, name, k, steps=8, grow_after=10**6)
    error = result if isinstance(result, BaseException) else result.error
    assert error is None, error
    print(f"host k's memory cgroup peak on a healthy fit: {peak(k) / GIB:.2f} GiB (limit {LIMIT / GIB:.1f} GiB)")
    assert peak(k) < PEAK_IDLE
    assert failure_alerts(run_of(hosts.backend, name)) == []


def oom_kills(host: Host) -> int:
    assert host.cgroup is not None
    text = host.cgroup / ("memory.oom_control" if (host.cgroup / "memory.oom_control").exists() else "memory.events")
    return int(re.search(r"^oom_kill (\d+)$", text.read_text(), re.MULTILINE).group(1))  # type: ignore[union-attr]


def growers(folder: Path) -> set[int]:
    """The ranks that grew (in any attempt)."""
    return {int(p.name.split("-")[1]) for p in folder.glob("grower-*")}


def test_a_rank_the_kernel_kills_for_memory_is_named_out_of_memory_in_each_attempt_and_the_recovery_said(
    hosts: HostCluster, hold: Callable[[Host], None], tmp_path: Path
) -> None:
    """On host k (Ray's memory monitor off), the rank grows until the kernel's OOM killer ends it,
    in both attempts (``max_failures=1``): each attempt's alert names that rank, out of memory, the
    kernel's OOM killer and the figures of its own memory cgroup; the second attempt trained again
    before it grew (its recovery said); the run ended failed, no other rank blamed."""
    k = hosts.hosts["k"]
    hold(hosts.hosts["m"])
    name = unique("mem-kernel")
    before = oom_kills(k)
    result = fit(hosts, tmp_path, name, k, steps=400, grow_after=3, max_failures=1)
    error = result if isinstance(result, BaseException) else result.error
    assert error is not None
    assert oom_kills(k) >= before + 2, "the host's cgroup did not count the kernel's kills"
    label, grown = node_labels()[k.node_id], growers(tmp_path)
    run = run_of(hosts.backend, name)
    alerts = failure_alerts(run)
    print("\n\n".join(f"[{a['severity']}] {a['title']}\n{a['text']}" for a in alerts))
    assert [a["title"] for a in alerts][1:2] == ["Attempt 2 recovered"], alerts
    failed = [alerts[0], *alerts[2:]]
    assert [a["severity"] for a in failed] == ["ERROR", "ERROR"], alerts
    sentence = re.compile(
        rf"Rank (\d+) on {re.escape(label)}: out of memory: killed by the kernel's OOM killer \(its memory cgroup "
        rf"counted \d+ OOM kills? as it died; limit 2\.0 GiB, peak [\d.]+ GiB; the rank used [\d.]+ GiB at its last "
        rf"sample\)"
    )
    for attempt, alert in enumerate(failed, 1):
        match = sentence.fullmatch(alert["text"].splitlines()[0])
        assert match and int(match.group(1)) in grown, alert["text"]
        assert alert["title"].startswith(
            f"Attempt {attempt}: Rank {match.group(1)}: out of memory: killed by the kernel's"
        )
        assert "other cause" not in alert["title"] and "Also failed at once" not in alert["text"]
    assert "No retries left" in failed[1]["text"]
    assert len(run.completes) == 1 and run.exit_codes[0] not in (0, None)


def test_a_rank_ray_s_memory_monitor_kills_is_named_out_of_memory_with_the_rank_that_grew(
    hosts: HostCluster, hold: Callable[[Host], None], tmp_path: Path
) -> None:
    """On host m (Ray's memory monitor at ``THRESHOLD`` of the limit), the rank grows until Ray's
    memory monitor ends it: one alert names it, out of memory, Ray's memory monitor, the node's use
    and threshold and the rank's size; the run ended failed. (Ray 2.60 kills the plugin's node
    logger with it, so the node's own account, which rank grew, is lost with the logger.)"""
    m = hosts.hosts["m"]
    hold(hosts.hosts["k"])
    name = unique("mem-monitor")
    before = oom_kills(m)
    result = fit(hosts, tmp_path, name, m, steps=400, grow_after=3)
    error = result if isinstance(result, BaseException) else result.error
    assert error is not None
    label, grown = node_labels()[m.node_id], growers(tmp_path)
    run = run_of(hosts.backend, name)
    alerts = failure_alerts(run)
    print("\n\n".join(f"[{a['severity']}] {a['title']}\n{a['text']}" for a in alerts))
    assert len(alerts) == 1 and alerts[0]["severity"] == "ERROR", alerts
    first = alerts[0]["text"].splitlines()[0]
    match = re.match(
        rf"Rank (\d+) on {re.escape(label)}: out of memory: killed by Ray's memory monitor \(node at \d+% of [\d.]+ "
        rf"GB, threshold {THRESHOLD * 100:.1f}%; the rank used ([\d.]+) GB",
        first,
    )
    assert match and int(match.group(1)) in grown, first
    assert float(match.group(2)) > PEAK_IDLE / GIB, first  # the size it grew to, as Ray measured it
    assert "other cause" not in alerts[0]["title"] and "Also failed at once" not in alerts[0]["text"]
    assert oom_kills(m) == before, "the kernel's OOM killer acted first"
    assert len(run.completes) == 1 and run.exit_codes[0] not in (0, None)
