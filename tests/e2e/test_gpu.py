"""End to end: GPU nodes, seen by wandb's real system monitor through the scripted NVML.

A CPU-less, GPU-less head (the driver, the Train controller and the run's primary) and three
one-CPU nodes with 2, 8 and 1 scripted GPUs (``tests/support/nvml.py``). Train workers ask
for a GPU each (``use_gpu=True``, gloo, the model on the CPU: torch here is a CPU build), and
each rank writes down its node and the GPU ids Ray gave it: the ground truth the assertions
compare with. A rank changes a node's scripted GPUs at a given step to script a GPU going bad
mid-run. (A Tune trial on a GPU node: ``tests/e2e/test_tune_multinode.py``.)

What this proves: what NVML says reaches the run, the node table and the straggler rule, through
wandb's own monitor and the plugin's writers. What it cannot: what real GPUs say (that is
``bench/gpu_check.py`` on a GPU machine).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import assert_nothing_left, node_labels, session_log_text, start_gpu_cluster, stop_cluster
from tests.support.env import WANDB_TABLES
from tests.support.nvml import ScriptedGpus
from tests.support.runs import final_table, gpu_checks, run_of, unique, user_rows
from tests.support.training import make_callback
from tests.support.wandb_backend import RunRecord, WandbTestBackend

pytestmark = pytest.mark.cluster

GPU_COUNTS = (2, 8, 1)
# The per-GPU series the issue names: wandb's key -> the scripted value it shows.
SERIES = {
    "gpu": lambda g: float(g.util),
    "memoryAllocated": lambda g: g.memory_allocated,
    "temp": lambda g: float(g.temp),
    "powerWatts": lambda g: g.power_w,
}


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[ScriptedGpus]]]:
    cluster, nodes = start_gpu_cluster(tmp_path_factory.mktemp("gpus"), *GPU_COUNTS)
    yield cluster, nodes
    stop_cluster(cluster)


@pytest.fixture
def nodes(gpu_cluster: tuple[Any, list[ScriptedGpus]]) -> list[ScriptedGpus]:
    """The GPU nodes, each GPU busy and a little different from the others (reset for each test)."""
    _, gpu_nodes = gpu_cluster
    for n, node in enumerate(gpu_nodes):
        for i in range(len(node.gpus)):
            node.gpus[i].util, node.gpus[i].temp = 93 + (n + i) % 5, 55 + 3 * n + i
            node.gpus[i].power_w, node.gpus[i].mem_used_mib = 480.0 + 10 * n + i, 20480 * (1 + (n + i) % 3)
            node.gpus[i].state = "ok"
        node.write()
    return gpu_nodes


def gpu_loop(config: dict[str, Any]) -> None:
    """Report every ``step_s``. Rank 0 rewrites a node's scripted GPUs at step ``script["step"]``;
    with ``own``, each rank changes its own GPU at the steps it names, and rank 0 the GPUs of
    its node that no rank holds (``own["unused"]``: step -> one change for each, in index order)."""
    import os
    import random
    import time

    import ray
    import ray.train

    from tests.support.nvml import ScriptedGpus

    rank = ray.train.get_context().get_world_rank()
    gpu_ids = [int(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"]]
    node_id = ray.get_runtime_context().get_node_id()
    with open(os.path.join(config["placement_dir"], f"rank-{rank}"), "w") as f:
        json.dump({"node_id": node_id, "gpu_ids": gpu_ids}, f)
    script, own, dies = config.get("script"), config.get("own"), config.get("dies")
    rnd, overrides = random.Random(rank), {}
    for step in range(config["reports"]):
        if script and rank == 0 and step == script["step"]:
            gpus = ScriptedGpus.read(script["path"])
            gpus.set_all(**script["values"])
        unused = (own or {}).get("unused", {}).get(str(step))
        if unused and rank == 0:  # every rank wrote its placement before the first report
            held = {json.loads(p.read_text())["gpu_ids"][0] for p in Path(config["placement_dir"]).iterdir()}
            with ScriptedGpus.locked(own["path"]) as gpus:
                for index, values in zip(sorted(set(range(len(gpus.gpus))) - held), unused, strict=False):
                    gpus.set(index, **values)
        if own:  # the ranks share one node and one file: each changes only its own GPU's line
            for key, value in own["events"].get(str(rank), {}).get(str(step), {}).items():
                overrides.pop(key, None) if value is None else overrides.__setitem__(key, value)
            noise = {
                "util": rnd.randint(92, 100),
                "sm_clock": rnd.randint(1900, 1980),
                "power_w": rnd.randint(480, 520),
            }
            with ScriptedGpus.locked(own["path"]) as gpus:
                gpus.set(gpu_ids[0], **{**noise, **overrides})
        if dies and rank == 0 and step == dies["errors_at"]:  # its GPU's memory fails...
            with ScriptedGpus.locked(dies["files"][node_id]) as gpus:
                gpus.set(gpu_ids[0], ecc_uncorrected=2)
        if dies and rank == 0 and step == dies["raises_at"]:  # ... and ends its CUDA process soon after
            raise RuntimeError("CUDA error: an uncorrectable ECC error was encountered")
        time.sleep(config["step_s"])
        ray.train.report({"step": step, "gpu_id": gpu_ids[0]})


def fit(
    tmp_path: Path, callback: Any, *, workers: int = 3, one_per_node: bool = True, fails: bool = False, **config: Any
) -> str:
    """The run's name; ``fails``: a rank raises, and with ``max_failures=0`` the run ends failed."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    name = unique("gpu")
    placement = tmp_path / "placement"
    placement.mkdir()
    # One worker a node (each node has one CPU), or Ray's default for use_gpu (one GPU, no CPU:
    # the workers pack onto the node with the most GPUs).
    resources = {"CPU": 1, "GPU": 1} if one_per_node else None
    run_config = RunConfig(
        name=name,
        storage_path=str(tmp_path / "storage"),
        callbacks=[callback],
        failure_config=FailureConfig(max_failures=0) if fails else None,
    )
    error: BaseException | None
    try:
        error = (
            TorchTrainer(
                gpu_loop,
                train_loop_config={"placement_dir": str(placement), **config},
                scaling_config=ScalingConfig(num_workers=workers, use_gpu=True, resources_per_worker=resources),
                torch_config=TorchConfig(backend="gloo"),  # a CPU build of torch: no NCCL
                run_config=run_config,
            )
            .fit()
            .error
        )
    except Exception as e:  # noqa: BLE001 - fit() raises the training error
        error = e
    assert (error is not None) == fails, error
    return name


def placement(tmp_path: Path) -> dict[int, dict[str, Any]]:
    """rank -> {node_id, gpu_ids}, as the ranks saw it."""
    return {int(p.name.split("-")[1]): json.loads(p.read_text()) for p in (tmp_path / "placement").iterdir()}


def gpu_series(run: RunRecord, label: str) -> dict[str, list[Any]]:
    return {k: v for k, v in run.system_metrics().get(label, {}).items() if k.startswith("gpu.")}


def test_each_node_shows_its_own_gpus_and_one_falling_to_40_percent_is_one_straggler_alert(
    gpu_cluster: Any, nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Path
) -> None:
    # One worker a node; gpu_device_ids=[0, 1]; the 8-GPU node's GPUs fall from 95 to 40 % at
    # the fifth report, the other two nodes stay busy (93 to 97 %).
    cluster, _ = gpu_cluster
    slow = nodes[1]
    callback = make_callback(straggler_window_s=1.5, gpu_device_ids=[0, 1])
    script = {"step": 4, "path": str(slow.path), "values": {"util": 40}}
    name = fit(tmp_path, callback, reports=40, step_s=0.25, script=script)

    run = run_of(backend, name)
    labels = node_labels()
    slow_label = labels[slow.node_id]
    assert run.labels == set(labels.values())
    # gpu_device_ids=[0, 1]: every node's writer samples GPUs 0 and 1 only, under their own indices.
    for node in nodes:
        shown = {k.split(".")[1] for k in gpu_series(run, labels[node.node_id])}
        assert shown == {"0", "1"} & {str(i) for i in range(len(node.gpus))}, (node.node_id, shown)
        checks = gpu_checks(run, labels[node.node_id], table=WANDB_TABLES)
        assert all(checks.values()) and len(checks) >= 3, checks
    # The busy nodes: each GPU's series under its node's label, with that GPU's scripted values.
    busy = [nodes[0], nodes[2]]
    for node in busy:
        series = gpu_series(run, labels[node.node_id])
        for i, gpu in enumerate(node.gpus[:2]):
            for key, value in SERIES.items():
                got = series.get(f"gpu.{i}.{key}")
                assert got and got == [pytest.approx(value(gpu))] * len(got), (node.node_id, i, key, got)
    assert gpu_series(run, labels[str(cluster.head_node.node_id)]) == {}  # the GPU-less head: none
    values = gpu_series(run, slow_label)["gpu.0.gpu"]
    assert values[0] > 90 and values[-1] == 40.0
    # The default rule on GPU nodes: exactly one alert, naming the node that fell.
    assert [(a["title"], a["severity"]) for a in run.alerts] == [(f"Straggler: {slow_label}", "WARN")]
    assert "GPU utilisation" in run.alerts[0]["text"], run.alerts[0]["text"]
    if WANDB_TABLES:  # the node table's GPU columns: each node's own means (see tests.support.env)
        table = final_table(run)
        for node in busy:
            row, sampled = table[labels[node.node_id]], node.gpus[:2]
            utils = [g.util for g in sampled]
            assert row["gpu_util_mean"] == pytest.approx(statistics.mean(utils), abs=0.01), row
            assert row["gpu_util_min"] == pytest.approx(min(utils), abs=0.01), row
            mem = statistics.mean(g.memory_allocated for g in sampled)
            assert row["gpu_mem"] == pytest.approx(mem, abs=0.01), row
            assert row["state"] == "ok"
        assert table[slow_label]["state"] == "straggler" and table[slow_label]["gpu_util_mean"] == 40.0
        head = table[labels[str(cluster.head_node.node_id)]]
        assert (head["gpu_util_mean"], head["gpu_util_min"], head["gpu_mem"]) == (None, None, None)
    # Each rank got a GPU of its own node, one rank a node.
    ranks = placement(tmp_path)
    assert sorted(r["node_id"] for r in ranks.values()) == sorted(n.node_id for n in nodes)
    assert [row["gpu_id"] for row in user_rows(run)] == [ranks[0]["gpu_ids"][0]] * 40
    assert_nothing_left()


def test_the_all_strategy_gives_each_rank_s_run_exactly_its_gpus(
    nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Path
) -> None:
    # Three workers of one GPU and no CPU pack onto the 8-GPU node: ranks of distinct GPU ids.
    name = fit(tmp_path, make_callback(strategy="all"), one_per_node=False, reports=6, step_s=0.3)

    ranks = placement(tmp_path)
    runs = {r.display_name: r for r in backend.runs.values() if r.group == name}
    assert set(runs) == {f"rank-{r}" for r in ranks}
    assert len({tuple(r["gpu_ids"]) for r in ranks.values()}) == len(ranks)  # distinct GPUs
    by_node = {node.node_id: node for node in nodes}
    for rank, where in ranks.items():
        run = runs[f"rank-{rank}"]
        series = gpu_series(run, f"rank-{rank}")
        (gpu_id,) = where["gpu_ids"]
        assert {k.rsplit(".", 1)[0] for k in series} == {f"gpu.{gpu_id}"}, (rank, sorted(series))
        util = by_node[where["node_id"]].gpus[gpu_id].util
        assert set(series[f"gpu.{gpu_id}.gpu"]) == {float(util)}
        assert [row["gpu_id"] for row in user_rows(run)] == [gpu_id] * 6


@pytest.mark.smoke
def test_one_bad_gpu_of_each_kind_is_named_live_with_its_node_and_rank(
    nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Path
) -> None:
    node = nodes[1]  # the 8-GPU node: four workers of one GPU and no CPU pack onto it
    events = {  # rank -> step -> what its GPU does from then on (None: back to normal)
        "0": {
            "8": {"sm_clock": 900, "power_w": 250},
            "28": {"sm_clock": None, "power_w": None},
        },  # throttles 5 s, recovers
        # uncorrectable memory errors: 2 in device memory since the driver loaded (the counter
        # wandb reads), 9 in the GPU's lifetime, 3 more in SRAM; the alert must say 2
        "1": {"8": {"ecc_uncorrected": 2, "ecc_uncorrected_aggregate": 9, "ecc_uncorrected_sram": 3}},
        "2": {"8": {"state": "lost"}},  # falls off the bus
        "3": {"0": {"state": "mig"}},  # MIG mode from its first step: no utilisation, the rest as ever
    }  # every GPU until step 8: busy, with noise (util 92-100 %, SM clock 1900-1980 MHz)
    # The node's four GPUs that no rank holds (another job's): one throttles, one gets memory
    # errors, one falls off the bus: the run judges only its own GPUs, so no alert for them.
    unused = [{"sm_clock": 600, "util": 100}, {"ecc_uncorrected": 5}, {"state": "lost"}]
    own = {"path": str(node.path), "events": events, "unused": {"8": unused}}
    # Sampled every 0.25 s: wandb writes its transaction log (the SM clock and ECC counts) a
    # 32 KiB block at a time, about every 6 samples of this node's 8 GPUs.
    callback = make_callback(straggler_window_s=1.5, sampling_interval_s=0.25)
    # 80 reports, 20 s: the alerts came 3 to 7 s in, the recovery from step 28 (7 s) is judged
    # by about 15 s, and rank 3's MIG GPU has 50 samples more of temperature than of utilisation.
    name = fit(tmp_path, callback, workers=4, one_per_node=False, reports=80, step_s=0.25, own=own)

    run = run_of(backend, name)
    label = node_labels()[node.node_id]
    gpu = {rank: where["gpu_ids"][0] for rank, where in placement(tmp_path).items()}
    assert all(where["node_id"] == node.node_id for where in placement(tmp_path).values())
    assert [(a["title"], a["severity"]) for a in run.alerts if "Slow GPU" in a["title"]] == [
        (f"Slow GPU: {label} GPU {gpu[0]}", "WARN"),
        (f"Slow GPU recovered: {label} GPU {gpu[0]}", "INFO"),
    ]
    assert sorted((a["title"], a["severity"]) for a in run.alerts) == sorted(
        [
            (f"Slow GPU: {label} GPU {gpu[0]}", "WARN"),
            (f"Slow GPU recovered: {label} GPU {gpu[0]}", "INFO"),
            (f"GPU memory errors: {label} GPU {gpu[1]}", "ERROR"),
            (f"GPU lost: {label} GPU {gpu[2]}", "ERROR"),
        ]
    )
    slow = next(a["text"] for a in run.alerts if a["title"].startswith("Slow GPU:"))
    assert f"GPU {gpu[0]} (NVIDIA H100 80GB HBM3) of {label} (host " in slow and ", rank 0)" in slow
    # the SM clock is the mean of the samples that showed it (a transaction-log block's)
    clock, median = (float(x) for x in re.findall(r"SM clock (\d+) MHz against (\d+) MHz", slow)[0])
    assert 900 <= clock < 0.7 * median and median >= 1900, slow
    # temperature and power as last read (the clock comes a log block later than they do)
    assert re.search(r"at \d+ % utilisation, \d+ C, \d+ W of 700 W", slow), slow
    ecc = next(a["text"] for a in run.alerts if a["title"].startswith("GPU memory errors"))
    assert "rank 1" in ecc and "uncorrectable" in ecc and ": 2, up from 0" in ecc, ecc
    # every alert asks W&B to drop the same title again within 300 s (wait_duration, sent in ms)
    assert {a["wait"] for a in run.alerts} == {300_000}, [a["wait"] for a in run.alerts]
    # Rank 3's MIG GPU is no lost GPU: its memory, temperature and power reach the run all along
    # (as many samples as rank 0's GPU), its utilisation stops (or never starts) at MIG's NOT_SUPPORTED.
    series, mig = gpu_series(run, label), gpu[3]
    assert not [a for a in run.alerts if a["title"] == f"GPU lost: {label} GPU {mig}"]
    for key in ("memoryAllocated", "temp", "powerWatts"):
        assert len(series[f"gpu.{mig}.{key}"]) == len(series[f"gpu.{gpu[0]}.{key}"]) >= 50, key
    assert len(series.get(f"gpu.{mig}.gpu", [])) < len(series[f"gpu.{mig}.temp"]) - 50
    if not WANDB_TABLES:
        return
    # Tables at most once a minute: this run (under a minute) logs the first alert's and the end's.
    tables = run.tables("gpus")
    assert 1 <= len(tables) <= 2, len(tables)
    last = {row["gpu"]: row for row in tables[-1] if row["node"] == label}
    assert {i: row["state"] for i, row in last.items()} == {
        i: {gpu[1]: "memory errors", gpu[2]: "lost"}.get(i, "ok") for i in range(len(node.gpus))
    }
    assert last[gpu[1]]["ecc_uncorrected"] == 2 and last[gpu[0]]["sm_clock"] >= 1900
    assert (last[gpu[2]]["util"], last[gpu[2]]["sm_clock"]) == (None, None)  # a lost GPU reads nothing
    assert last[mig]["util"] is None and None not in (last[mig]["memory"], last[mig]["temp"], last[mig]["power_w"])
    assert {last[gpu[r]]["ranks"] for r in range(4)} == {"0", "1", "2", "3"}
    assert {row["ranks"] for i, row in last.items() if i not in gpu.values()} == {""}  # not judged
    row = final_table(run)[label]
    assert row["gpus_not_ok"] == ", ".join(
        f"GPU {i} {state}" for i, state in sorted([(gpu[1], "memory errors"), (gpu[2], "lost")])
    )
    assert row["state"] == "ok"  # one problem, one alert: the node is no straggler for it


def test_a_rank_that_dies_of_its_gpus_memory_errors_ends_a_run_that_names_the_gpu(
    nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Path
) -> None:
    # One rank; its GPU gets 2 uncorrectable ECC errors, and 2.5 s later the rank raises (an
    # uncorrectable error ends the CUDA process): with max_failures=0 the run ends there. Every
    # writer samples GPU 0 only, once a second: a transaction-log block then holds about 20
    # samples (20 s), so the block with the errors is still being written when the run ends, and
    # only the final judgement (the writer finished, its log read to the end) can see them.
    callback = make_callback(sampling_interval_s=1.0, gpu_device_ids=[0])
    dies = {"files": {n.node_id: str(n.path) for n in nodes}, "errors_at": 2, "raises_at": 7}
    name = fit(tmp_path, callback, workers=1, one_per_node=False, fails=True, reports=20, step_s=0.5, dies=dies)

    run = run_of(backend, name)
    (where,) = placement(tmp_path).values()
    assert where["gpu_ids"] == [0], where  # Ray gives the first free GPU: the one every writer samples
    label = node_labels()[where["node_id"]]
    assert [row["step"] for row in user_rows(run)] == [0, 1, 2, 3, 4, 5, 6]
    # Two alerts, each of its own: the rank's death (its cause, as the rank raised it, on its node
    # and GPU: issue 37's failure alert) and the GPU's memory errors (the GPU rule's, from the
    # final judgement of the node's samples).
    failed = "Rank 0 failed: RuntimeError: CUDA error: an uncorrectable ECC error was encountered"
    by_title = {a["title"]: a for a in run.alerts}
    assert sorted((a["title"], a["severity"]) for a in run.alerts) == sorted(
        [(failed, "ERROR"), (f"GPU memory errors: {label} GPU 0", "ERROR")]
    ), run.alerts
    assert f"on {label} (GPU 0)" in by_title[failed]["text"], by_title[failed]["text"]
    text = by_title[f"GPU memory errors: {label} GPU 0"]["text"]
    assert f"GPU 0 (NVIDIA H100 80GB HBM3) of {label} (host " in text and ", rank 0)" in text, text
    assert "uncorrectable" in text and ": 2, up from 0" in text, text
    assert run.exit_codes == [1]


def test_a_gpu_job_on_a_node_where_nvml_finds_no_driver_is_one_warning_naming_it(
    gpu_cluster: Any, nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Path
) -> None:
    # The 1-GPU node's NVML stand-in loses its GPU file: its init then fails as NVML's does
    # without NVIDIA's driver, so wandb's monitor there reports no GPU while Ray gives its rank one.
    cluster, _ = gpu_cluster
    bare = nodes[2]
    os.replace(bare.path, bare.path.with_name(bare.path.name + ".hidden"))
    try:
        # 6 s of reports, on top of the writers' samples before them: five sampling intervals
        # (degradation.NO_GPU_INTERVALS, 2.5 s) and the fleet's next ping (3 s) say it.
        name = fit(tmp_path, make_callback(), reports=12, step_s=0.5)
    finally:
        bare.write()

    run = run_of(backend, name)
    labels = node_labels()
    label = labels[bare.node_id]
    assert gpu_series(run, label) == {} and all(gpu_series(run, labels[n.node_id]) for n in nodes[:2])
    said = session_log_text(cluster)
    warned = re.findall(
        r"(node-\S+) \(host [^)]*\) runs ranks that Ray gave GPUs, yet its writer's samples show no GPU.*", said
    )
    assert [w.split(" ")[0] for w in warned] == [label], warned  # that node, once
    (line,) = [ln for ln in said.splitlines() if f"{label} (host " in ln and "runs ranks that Ray gave GPUs" in ln]
    assert "no libnvidia-ml.so.1 in the container" in line and "by its CPU share" in line
