"""End to end: a TorchTrainer on a local three-node cluster with WandbNodesCallback.

The cluster is a head with no CPU and no GPU (the driver and the Train controller live there)
and two one-CPU worker nodes with 2 and 1 scripted GPUs (``tests/support/nvml.py``), so two
train workers take every CPU of every node, and wandb's own monitor on each worker node reports
that node's GPUs. The real wandb client in the controller and in the node loggers talks to the
test backend.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import training
from tests.support.cluster import (
    assert_nothing_left,
    free_port,
    node_labels,
    node_logger_count,
    session_log_text,
    start_cluster,
    stop_cluster,
)
from tests.support.env import DUMMY_KEY, FAST, WANDB_SAMPLES_AT_JOIN, offline_backend
from tests.support.nvml import Gpu, ScriptedGpus
from tests.support.runs import (
    HEALTH_KEYS,
    assert_one_writer_per_label,
    failure_alerts,
    rank_console,
    rank_labels,
    run_of,
    unique,
    user_rows,
)
from tests.support.training import REPORTS, SECRETS_MASKED, fit, make_callback, said
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster
OFFLINE_REPORTS = 40  # the offline run's: one every 0.25 s
REPORTED = list(range(1, OFFLINE_REPORTS + 1))


@pytest.fixture(scope="module")
def gpu_nodes(tmp_path_factory: pytest.TempPathFactory) -> list[ScriptedGpus]:
    folder = tmp_path_factory.mktemp("gpus")
    return [
        ScriptedGpus(folder / "a.txt", [Gpu(util=91, temp=64), Gpu(util=87, temp=66)], node="a"),
        ScriptedGpus(folder / "b.txt", [Gpu(util=78, power_w=420.0)], node="b"),
    ]


@pytest.fixture(scope="module")
def cluster(gpu_nodes: list[ScriptedGpus]) -> Iterator[Any]:
    c = start_cluster(head_cpus=0, gpu_nodes=[(1, gpus) for gpus in gpu_nodes])
    yield c
    stop_cluster(c)


@pytest.fixture(autouse=True)
def _preemption_watcher_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's defaults here: its preemption watcher (off in the other modules, tests/conftest.py)."""
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")


def head_node_id(cluster: Any) -> str:
    return str(cluster.head_node.node_id)


def primary_client(run: Any, label: str) -> str:
    clients = [c for c, labels in run.labels_by_client().items() if label in labels]
    assert len(clients) == 1, run.labels_by_client()
    return clients[0]


@pytest.mark.smoke
def test_one_run_shows_every_node_and_rank0_metrics(
    cluster: Any, gpu_nodes: list[ScriptedGpus], backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("every-node")
    result = fit(name, make_callback(tags=["e2e"]), str(tmp_path), torch=True)
    assert result.error is None

    run = run_of(backend, name)
    labels = node_labels()
    assert run.labels == set(labels.values())
    assert_one_writer_per_label(run)
    for label in labels.values():
        assert "memory_percent" in run.system_metrics()[label], label
    # Each worker node's GPUs under its own label, with its own values; none from the head.
    for node in gpu_nodes:
        series = run.system_metrics()[labels[node.node_id]]
        assert {k.split(".")[1] for k in series if k.startswith("gpu.")} == {str(i) for i in range(len(node.gpus))}
        for i, gpu in enumerate(node.gpus):
            assert set(series[f"gpu.{i}.gpu"]) == {float(gpu.util)}
            assert set(series[f"gpu.{i}.temp"]) == {float(gpu.temp)}
            assert set(series[f"gpu.{i}.powerWatts"]) == {gpu.power_w}
            assert set(series[f"gpu.{i}.memoryAllocated"]) == {gpu.memory_allocated}
    assert not [k for k in run.system_metrics()[labels[head_node_id(cluster)]] if k.startswith("gpu.")]

    expected = [
        {"step": s, "rank": 0, "score": s, "nested/depth": s, "training_iteration": s + 1} for s in range(REPORTS)
    ]
    got = [{k: v for k, v in row.items() if k != "loss"} for row in user_rows(run)]
    assert got == expected
    assert all(isinstance(row["loss"], float) for row in user_rows(run))

    head_label = labels[head_node_id(cluster)]
    assert run.completes == [type(run.completes[0])(client_id=primary_client(run, head_label), exit_code=0)]
    assert len(run.client_ids) == 3
    assert run.config["lr"]["value"] == 0.05
    ranks_by_node = run.config["ray_train"]["value"]["ranks_by_node"]
    assert sorted(r for ranks in ranks_by_node.values() for r in ranks) == [0, 1]
    assert run.tags == ["e2e"]
    # The Logs tab (rank_console="rank0", the default): rank 0's prints, each once (Ray writes a
    # print to the rank's stdout and stderr), from its node's writer; no line of the healthy rank 1.
    console = rank_console(run)
    assert [text for _, text in console[0] if text.startswith("rank 0 ")] == [said(0, s) for s in range(REPORTS)]
    assert {label for label, _ in console[0]} == {rank_labels(run)[0]}
    assert 1 not in console, console.get(1)
    # No line twice in the whole Logs tab (every writer's: the controller's own console and the
    # ranks' lines; a print is in both of the rank's files, a line must not come from two writers).
    twice = [line for line, n in Counter(x.text for x in run.console()).items() if n > 1]
    assert not twice, twice
    assert DUMMY_KEY not in str(run.config) + str(run.summary)
    assert DUMMY_KEY not in session_log_text(cluster)
    # A healthy job: no failure named, none in the summary.
    assert not failure_alerts(run) and "failure" not in run.summary, (run.alerts, run.summary)
    assert not [f for f in run.files if f.startswith("failures/")]
    assert_nothing_left()


@pytest.mark.smoke
@pytest.mark.skipif(not WANDB_SAMPLES_AT_JOIN, reason="wandb < 0.31 samples first one sampling interval after joining")
def test_every_node_is_sampled_before_its_workers_enter_the_train_function(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    from ray_wandb_nodes import WandbNodesCallback

    name = unique("first-sample")
    entries = tmp_path / "entries"
    entries.mkdir()
    # The default sampling interval (15 s): a writer samples as it joins, and the start waits for it.
    callback = WandbNodesCallback(project="e2e", init_timeout_s=30, finish_timeout_s=30, settings=FAST)
    result = fit(name, callback, str(tmp_path), entries=str(entries), torch=True)
    assert result.error is None

    run = run_of(backend, name)
    labels = node_labels()
    entered: dict[str, list[float]] = {}
    for p in entries.iterdir():
        node_id, _, at = p.name.split("-", 2)
        entered.setdefault(node_id, []).append(float(at))
    assert len(entered) == 2 and head_node_id(cluster) not in entered  # two worker nodes
    firsts = {
        label: min(row["_timestamp"] for row in run.events if any(k.endswith(f"/l:{label}") for k in row))
        for label in run.labels
    }
    for node_id, times in entered.items():
        assert firsts[labels[node_id]] <= min(times), (labels[node_id], firsts[labels[node_id]], min(times))


@pytest.mark.smoke
def test_training_error_surfaces_and_run_fails(cluster: Any, backend: WandbTestBackend, tmp_path: Any) -> None:
    name = unique("fails")
    result = None
    try:
        result = fit(name, make_callback(), str(tmp_path), fail_at=2, fail_rank=1, torch=True, print_secrets=True)
    except Exception as e:  # noqa: BLE001 - fit() raises the training error
        error: BaseException | None = e
    else:
        error = result.error
    assert error is not None and "training blew up on purpose" in str(error)

    run = run_of(backend, name)
    # Each rank reports steps 0 and 1, then rank 1 raises. Ray's poll takes one report a rank
    # (worker.py's poll_status, 2.50-2.60) and a poll that sees the error ends the attempt: where
    # polls lagged (2 loaded cores), step 1's report was still queued and Ray never handed it on.
    assert [row["step"] for row in user_rows(run)] in ([0], [0, 1])
    assert len(run.completes) == 1
    assert run.completes[0].exit_code not in (0, None)
    # The failure named in the run: rank 1, its node, the exception at the user's frame (no
    # retries: no attempt number); rank 0, stopped by Ray, never a cause.
    node = {r: label for label, ranks in run.config["ray_train"]["value"]["ranks_by_node"].items() for r in ranks}[1]
    code = 'raise ValueError("training blew up on purpose")'
    line = next(i for i, text in enumerate(inspect.getsource(training).splitlines(), 1) if text.strip() == code)
    alerts = failure_alerts(run)
    assert [(a["title"], a["severity"]) for a in alerts] == [
        ("Rank 1 failed: ValueError: training blew up on purpose", "ERROR")
    ]
    assert re.split(r"\nWhat followed|\nThe run failed", alerts[0]["text"])[0] == (
        f"Rank 1 on {node} raised ValueError: training blew up on purpose\n"
        f"  at training.py:{line} in train_loop: {code}"
    )
    assert "The run failed (FailureConfig max_failures=0: no retries)." in alerts[0]["text"]
    assert run.summary["failure"] == {
        "attempt": 1, "kind": "raised", "cause": "ValueError: training blew up on purpose", "rank": 1, "node": node,
        "where": f"training.py:{line} in train_loop", "ranks": "1", "recovered": False,
    }  # fmt: skip
    assert "ValueError: training blew up on purpose" in run.files["failures/attempt-1/rank-1.txt"].decode()
    # The failed attempt brings rank 1's last lines (the default leaves a healthy rank 1 out): its
    # prints, then its traceback, from its node's writer, before the run ended.
    console = rank_console(run)
    texts = [text for _, text in console[1]]
    tail = texts[texts.index(said(1, 0)) :]
    assert said(1, 1) in tail and "Traceback (most recent call last):" in tail, texts
    traceback = tail[tail.index("Traceback (most recent call last):") :]
    assert any('raise ValueError("training blew up on purpose")' in t for t in traceback), traceback
    assert "ValueError: training blew up on purpose" in traceback, traceback
    assert {label for label, _ in console[1]} == {rank_labels(run)[1]}
    # The secrets it printed before it raised: masked on its node, and in no line of the run unmasked.
    assert SECRETS_MASKED in tail, tail
    assert not any(secret in x.text for x in run.console() for secret in ("0123456789abcdef", "AKIAIOSFODNN7"))
    # Rank 0 (live) prints its step 2 before its report waits for rank 1, unless Ray ended it first.
    rank0 = [text for _, text in console[0] if text.startswith("rank 0 ")]
    assert rank0 in ([said(0, 0), said(0, 1)], [said(0, 0), said(0, 1), said(0, 2)]), rank0
    assert_nothing_left()


def test_workers_taking_every_cpu_still_start(cluster: Any, backend: WandbTestBackend, tmp_path: Any) -> None:
    name = unique("saturated")
    result = fit(name, make_callback(nodes="cluster", rank_console="off"), str(tmp_path), report_free_cpus=True)
    assert result.error is None
    run = run_of(backend, name)
    assert [row["free_cpus"] for row in user_rows(run)] == [0.0] * REPORTS
    assert rank_console(run) == {}  # rank_console="off": no rank's line
    assert run.labels == set(node_labels().values())
    assert_one_writer_per_label(run)
    assert_nothing_left()


def test_restart_by_name_writes_to_the_same_run(cluster: Any, backend: WandbTestBackend, tmp_path: Any) -> None:
    name = unique("resume")
    fit(name, make_callback(excludes=["nested", "rank"]), str(tmp_path), reports=2)
    fit(name, make_callback(excludes=["nested", "rank"]), str(tmp_path), reports=2)
    run = run_of(backend, name)
    assert [row["training_iteration"] for row in user_rows(run)] == [1, 2, 3, 4]
    assert not any("rank" in row or "nested/depth" in row for row in user_rows(run))
    assert [c.exit_code for c in run.completes] == [0, 0]


@pytest.mark.smoke
def test_offline_run_lands_in_one_folder_then_report_and_sync_show_every_node(
    cluster: Any,
    gpu_nodes: list[ScriptedGpus],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ray_wandb_nodes import cli
    from ray_wandb_nodes._wandb.txlog import read_run
    from ray_wandb_nodes.offline.index import node_local_dir

    with offline_backend(tmp_path, monkeypatch) as (wandb_dir, own_backend):
        name = unique("offline")
        # Through the run's storage (a local path here, which every simulated node shares); node
        # a's GPU 1 falls off the bus at the ninth report (once the run has seen it), 2 s in; the
        # run goes on 8 s more, past two of the fleet's pings (3 s apart) and the 1 s window: time
        # for the live rules to have said it, had they judged a GPU no rank holds.
        callback = make_callback(mode="offline", offline_transfer="storage", straggler_window_s=1)
        lost = {"step": 8, "path": str(gpu_nodes[0].path), "index": 1, "values": {"state": "lost"}}
        try:
            result = fit(
                name, callback, str(tmp_path), step_sleep_s=0.25, reports=OFFLINE_REPORTS, gpu_script=lost, torch=True
            )
        finally:
            gpu_nodes[0].write()  # back, for the next tests' writers
        assert result.error is None
        assert own_backend.requests == []  # offline: nothing went out

        # One folder for the run: the primary's offline run and every node writer's, and an index.
        (folder,) = (wandb_dir / "ray_wandb_nodes").iterdir()
        index = json.loads((folder / "index.json").read_text())
        run_id = index["run_id"]
        assert folder.name == run_id and run_id.startswith(name) and index["exit_code"] == 0
        labels = node_labels()
        head_label = labels[head_node_id(cluster)]
        writers = {w["label"]: w for w in index["writers"]}
        assert set(writers) == set(labels.values())
        assert {label: (w["role"], w["state"]) for label, w in writers.items()} == {
            label: ("primary", "written") if label == head_label else ("node", "collected") for label in writers
        }
        assert {w["node_id"] for w in writers.values()} == set(labels)
        assert {label: w.get("via") for label, w in writers.items() if label != head_label} == dict.fromkeys(
            set(writers) - {head_label}, "storage"
        )
        assert not (tmp_path / name / "ray_wandb_nodes").exists()  # the storage copies are gone
        assert sorted(index["worker_nodes"]) == sorted(n for n in labels if n != head_node_id(cluster))
        logs = sorted(folder.glob("**/run-*.wandb"))
        assert len(logs) == 3
        for label, w in writers.items():
            (log_path,) = (folder / w["path"]).glob("**/run-*.wandb")
            log = read_run(str(log_path))
            assert log.run_id == run_id and log.labels == [label] and log.exit_code == 0
            assert len(log.stats[label]) >= 2, (label, len(log.stats[label]))
            if label == head_label:
                assert [row["training_iteration"] for row in log.history if not HEALTH_KEYS & set(row)] == REPORTED
                # the node and GPU tables, offline too: the last at the last step (the transaction
                # log flattens the table's reference: nodes/path, nodes/_type, ...)
                tables = [row for row in log.history if row.get("nodes/_type") == "table-file"]
                assert tables and tables[-1]["training_iteration"] == OFFLINE_REPORTS
                assert all(row.get("gpus/_type") == "table-file" for row in tables)
            else:
                assert log.history == [] and not os.path.exists(node_local_dir(run_id, label))

        # report: every node, from the folder alone.
        capsys.readouterr()
        assert cli.main(["report", str(folder), "--json"]) == 0
        (report,) = json.loads(capsys.readouterr().out)["runs"]
        assert report["run_id"] == run_id and report["history_rows"] == OFFLINE_REPORTS
        assert {n["label"]: n["role"] for n in report["nodes"]} == {label: w["role"] for label, w in writers.items()}
        assert all(n["samples"] >= 2 and n["mem_mean"] > 0 for n in report["nodes"])
        # The report's GPU columns: each worker node's scripted GPUs, none on the head.
        by_label = {n["label"]: n for n in report["nodes"]}
        assert by_label[head_label]["gpus"] == [] and by_label[head_label]["gpu_util_mean"] is None
        for node in gpu_nodes:
            gpus = by_label[labels[node.node_id]]["gpus"]
            assert [g["index"] for g in gpus] == list(range(len(node.gpus)))
            for g, scripted in zip(gpus, node.gpus, strict=True):
                assert (g["util_mean"], g["util_max"]) == (scripted.util, scripted.util)
                assert g["mem_mean"] == pytest.approx(scripted.memory_allocated)
        assert cli.main(["report", str(folder), "--png", str(tmp_path / "nodes.png")]) == 0
        text = capsys.readouterr().out
        assert "gpu0    util% 91/91" in text and "gpu1    util% 87/87" in text and "gpu0    util% 78/78" in text
        assert "no GPU metrics" not in text
        # The job's two workers hold no GPU (a CPU job on GPU nodes): the live rules judge only the
        # GPUs a run's ranks hold, so the run raised no alert for the lost one; the report, which
        # has no ranks and judges every GPU, flags it with the same rule's words.
        lost_label = labels[gpu_nodes[0].node_id]
        # No alert is about a GPU. The CPU rule's may come: the workers hold no GPU, so their nodes
        # are compared by the CPU of their Ray processes, which on one loaded machine (every
        # simulated node shares its cores) differ by more than the rule's floor over the 1 s window
        # this run sets (the default window is 120 s).
        about_gpus = [a for a in index.get("alerts") or [] if a["gpus"] or "CPU (%)" not in a["text"]]
        assert not about_gpus, about_gpus
        assert f"ERROR GPU lost: {lost_label} GPU 1" not in text
        assert f"{lost_label}: GPU 1 stopped reporting while its node samples on" in text
        from PIL import Image

        # CPU, memory, GPU utilisation, GPU memory and network: five panels of 2.6 in at 90 dpi.
        assert Image.open(tmp_path / "nodes.png").size[1] == round(5 * 2.6 * 90)

        # sync: one online run with every node's label and the primary's history, completed once.
        assert cli.main(["sync", str(folder)]) == 0
        (run,) = own_backend.runs.values()
        assert run.run_id == run_id and run.display_name == name
        assert run.labels == set(labels.values())
        assert_one_writer_per_label(run)
        assert [row["training_iteration"] for row in user_rows(run)] == REPORTED
        assert run.completes == [type(run.completes[0])(client_id=primary_client(run, head_label), exit_code=0)]
        assert all(os.path.exists(str(p) + ".synced") for p in logs)
        # The Logs tab offline too: rank 0's prints once each, under its node's label after the sync.
        console = rank_console(run)
        rank0 = [text for _, text in console[0] if text.startswith("rank 0 ")]
        assert rank0 == [said(0, s) for s in range(OFFLINE_REPORTS)], rank0
        assert {label for label, _ in console[0]} == {rank_labels(run)[0]}
    assert_nothing_left()


def test_disabled_mode_sends_nothing_and_starts_no_actor(
    cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with WandbTestBackend() as own_backend:
        monkeypatch.setenv("WANDB_BASE_URL", own_backend.base_url)
        loggers_before = node_logger_count()
        result = fit(unique("disabled"), make_callback(mode="disabled"), str(tmp_path))
        assert result.error is None
        time.sleep(1)
        assert own_backend.requests == []
    assert node_logger_count() == loggers_before


def test_unreachable_backend_warns_and_training_completes(
    cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{free_port()}")
    name = unique("unreachable")
    from ray_wandb_nodes import WandbNodesCallback

    callback = WandbNodesCallback(project="e2e", init_timeout_s=3, finish_timeout_s=5, settings=FAST)
    started = time.monotonic()
    result = fit(name, callback, str(tmp_path))
    assert result.error is None
    # Not held by the unreachable W&B: a fit that waited on wandb's own init timeout (90 s, the
    # default init_timeout_s) would end past it; four reports take 10-20 s, twice that in a loaded
    # lane, and the callback's bounds (init 3 s, finish 5 s) add at most 8 s: 75 s tells them apart.
    assert time.monotonic() - started < 75
    # A ceiling on an event: the warning is in a process's log file as it is said (Ray's processes
    # write their files unbuffered); 30 s leaves a loaded machine's scheduling room.
    wait_until(lambda: "could not create the W&B run" in session_log_text(cluster), 30, "the warning in the logs")
    logs = session_log_text(cluster)
    assert f"ray_wandb_nodes: could not create the W&B run {name}" in logs
    assert DUMMY_KEY not in logs
    assert_nothing_left()


def test_a_node_writer_that_cannot_join_is_one_warning_and_training_goes_on(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("node-init-fails")
    backend.faults.add(status=403, path_contains="/graphql", joiners_only=True)
    try:
        result = fit(name, make_callback(), str(tmp_path))
    finally:
        backend.faults.clear()
    assert result.error is None
    run = run_of(backend, name)
    head_label = node_labels()[head_node_id(cluster)]
    assert run.labels == {head_label}
    assert [row["step"] for row in user_rows(run)] == list(range(REPORTS))
    assert run.exit_codes == [0]
    # A ceiling on an event (the warning in a log file, written as said): 30 s, as above.
    wait_until(lambda: "could not join the W&B run" in session_log_text(cluster), 30, "the warning in the logs")
    warnings = [
        line for line in session_log_text(cluster).splitlines() if "could not join the W&B run " + run.run_id in line
    ]
    worker_labels = set(node_labels().values()) - {head_label}
    assert {label for label in worker_labels if any(label in w for w in warnings)} == worker_labels
    assert len(warnings) == len(worker_labels)
    assert_nothing_left()
