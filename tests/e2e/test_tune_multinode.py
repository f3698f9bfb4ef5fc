"""End to end: Ray Tune experiments on a local four-node cluster with WandbNodesTuneCallback.

A CPU-less head (the Tune driver) and three one-CPU nodes, the third with two scripted GPUs
(``tests/support/nvml.py``): trials of a function trainable spread over the nodes, one trial
each. The real wandb client in the driver and in the node loggers talks to the test backend.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from pyarrow.fs import FSSpecHandler

from tests.support.cluster import assert_nothing_left, node_labels, start_cluster, stop_cluster
from tests.support.env import DUMMY_KEY, FAST, WANDB_TABLES, offline_backend
from tests.support.nvml import Gpu, ScriptedGpus
from tests.support.runs import unique, user_rows
from tests.support.training import make_tune_callback, train_loop
from tests.support.tune_runs import experiment_runs, sampled_markers
from tests.support.wandb_backend import WandbTestBackend

pytestmark = pytest.mark.cluster

ITERATIONS = 4


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory: pytest.TempPathFactory) -> ScriptedGpus:
    """The third node's two scripted GPUs (tests/support/nvml.py): a trial placed there must show them."""
    path = tmp_path_factory.mktemp("gpus") / "gpus.txt"
    return ScriptedGpus(path, [Gpu(util=88, power_w=410.0), Gpu(util=76, temp=71)], node="tune")


@pytest.fixture(scope="module")
def cluster(gpu_node: ScriptedGpus) -> Iterator[Any]:
    c = start_cluster(1, 1, head_cpus=0, gpu_nodes=[(1, gpu_node)])
    yield c
    stop_cluster(c)


def trainable(config: dict[str, Any]) -> None:
    import os
    import time

    import ray
    from ray import tune

    node_id = ray.get_runtime_context().get_node_id()
    if config.get("sampled_dir"):  # wait (bounded) for this node's writer to sample into the run
        from tests.support.wait import wait_until

        sampled = os.path.join(config["sampled_dir"], node_id)
        wait_until(lambda: os.path.exists(sampled), 60, f"{sampled} (this node's writer sampled)", every_s=0.1)
    gpu = lose_gpu(config, node_id) if config.get("lose_gpu") and ray.get_gpu_ids() else None
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    for i in range(start, ITERATIONS):
        time.sleep(config.get("sleep", 0.3))
        marker = os.path.join(config.get("marker_dir", ""), f"failed-{config['x']}")
        if config.get("fail_once_at") == i and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("interrupted on purpose")
        if config.get("fail_at") == i:
            raise RuntimeError("trial failed on purpose")
        metrics = {"score": 10 * config["x"] + i, "node_id": node_id}
        if gpu is not None:
            metrics["gpu"] = gpu
        if config.get("checkpoint"):
            import tempfile

            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(i + 1))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)


def lose_gpu(config: dict[str, Any], node_id: str) -> int:
    """In a trial holding one GPU: once every GPU trial's run holds samples of this node (a CPU
    trial's run there does not count), the trial holding GPU ``index`` loses it (off the bus);
    each GPU trial then waits for the experiment's first GPU-lost alert and ``after_s`` more (time enough
    for a run judging that GPU to alert too). Returns the trial's GPU."""
    import os
    import time

    import ray
    from ray import tune

    from tests.support.nvml import ScriptedGpus
    from tests.support.wait import wait_until

    script, folder = config["lose_gpu"], config["sampled_dir"]
    (gpu,) = (int(i) for i in ray.get_gpu_ids())
    trial_id = tune.get_context().get_trial_id()  # its run's id
    own = os.path.join(folder, f"{node_id}-{trial_id}")
    wait_until(lambda: os.path.exists(own), 90, "this trial's run to sample this node", every_s=0.1)
    open(os.path.join(folder, f"gpu-trial-{trial_id}"), "w").close()

    def ready() -> int:
        return len([f for f in os.listdir(folder) if f.startswith("gpu-trial-")])

    wait_until(lambda: ready() >= script["trials"], 90, "every GPU trial's run to sample this node", every_s=0.1)
    if gpu == script["index"]:
        with ScriptedGpus.locked(script["path"]) as gpus:
            gpus.set(gpu, state="lost")
    alerted = os.path.join(folder, "alerted")
    wait_until(lambda: os.path.exists(alerted), 60, "the experiment's first GPU-lost alert", every_s=0.1)
    time.sleep(script["after_s"])
    return gpu


def train_driver(config: dict[str, Any]) -> None:
    """A Tune trial that wraps a two-worker TorchTrainer (Train V2 inside Tune)."""
    from ray import train, tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from ray_wandb_nodes import WandbNodesCallback

    ctx = tune.get_context()
    TorchTrainer(
        train_loop,
        # Long enough for node writers that join after the workers start to sample.
        train_loop_config={
            "lr": 0.05,
            "reports": config.get("reports", 6),
            "step_sleep_s": 0.5,
            "checkpoint": True,
            "stall": config.get("stall"),
        },
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=f"{ctx.get_experiment_name()}-{ctx.get_trial_id()}",
            storage_path=config["storage"],
            callbacks=[
                TuneReportCallback(),
                WandbNodesCallback(
                    project="tune-e2e",
                    sampling_interval_s=0.5,
                    settings=FAST,
                    hang_timeout_s=config.get("hang_timeout_s", "auto"),
                ),
            ],
        ),
    ).fit()


# The trial's Train run stalls at its last step: its workers return right after, before a ping of
# the trial's fleet need see them move, and the hang is closed by what the Train run inside tells
# the trial's run (its ranks finished) or by the run's end. (A hang in a trial's last seconds ended
# without its "Hang over" before; the test then ran twelve steps after its stall so that a ping
# saw the ranks move again.)
REPORTS_AROUND_STALL = 6
STALL_CEILING_S = 120.0  # a ceiling only: the stall ends at the hang alert (see the test)


make_callback = partial(make_tune_callback, project="tune-e2e")


def tuner(fn: Any, name: str, storage: str, param_space: dict[str, Any], callback: Any) -> Any:
    from ray import tune

    return tune.Tuner(
        fn,
        param_space=param_space,
        run_config=tune.RunConfig(name=name, storage_path=storage, callbacks=[callback]),
    )


@pytest.mark.smoke
def test_each_trial_gets_a_run_labelled_for_its_own_node(
    cluster: Any, gpu_node: ScriptedGpus, backend: WandbTestBackend, tmp_path: Any
) -> None:
    from ray import tune

    name = unique("tune-three")
    with sampled_markers(backend, name, tmp_path / "sampled") as sampled:
        space = {"x": tune.grid_search([0, 1, 2]), "checkpoint": True, "sleep": 0.5, "sampled_dir": sampled}
        results = tuner(trainable, name, str(tmp_path), space, make_callback(upload_checkpoints=True)).fit()
    assert not results.errors
    runs = experiment_runs(backend, name)
    assert len(runs) == 3
    labels = node_labels()
    for result in results:
        trial_id = result.metrics["trial_id"]
        run = runs[trial_id]
        x = result.config["x"]
        assert run.display_name.endswith(trial_id)
        assert run.labels == {labels[result.metrics["node_id"]]}
        # The trial on the GPU node: its run holds that node's GPU series, the others none.
        series = run.system_metrics()[labels[result.metrics["node_id"]]]
        gpus = {k: v for k, v in series.items() if k.startswith("gpu.")}
        if result.metrics["node_id"] == gpu_node.node_id:
            for i, gpu in enumerate(gpu_node.gpus):
                assert set(gpus[f"gpu.{i}.gpu"]) == {float(gpu.util)}
                assert set(gpus[f"gpu.{i}.powerWatts"]) == {gpu.power_w}
                assert set(gpus[f"gpu.{i}.temp"]) == {float(gpu.temp)}
            assert {k.split(".")[1] for k in gpus} == {"0", "1"}
        else:
            assert gpus == {}
        assert [row["score"] for row in user_rows(run)] == [10 * x + i for i in range(ITERATIONS)]
        assert [row["training_iteration"] for row in user_rows(run)] == list(range(1, ITERATIONS + 1))
        assert run.config["x"]["value"] == x
        assert run.config["trial_id"]["value"] == trial_id
        # As Ray's WandbLoggerCallback: the trial's own folder (its driver-side staging copy).
        assert os.path.basename(run.config["trial_log_path"]["value"]) == os.path.basename(result.path)
        assert "node_id" not in user_rows(run)[0]  # strings are left out, as Ray's callback does
        assert run.exit_codes == [0]
        if WANDB_TABLES:  # each trial's run holds its node table, logged while the trial ran
            tables = run.tables("nodes")
            assert tables and [row["node"] for row in tables[-1]] == [labels[result.metrics["node_id"]]]
            assert {row["state"] for table in tables for row in table} == {"ok"}
        # upload_checkpoints: every checkpoint's files reached W&B as a model artifact.
        assert [a.files.get("step") for a in run.models] == [str(i + 1).encode() for i in range(ITERATIONS)]
        assert {(a.name, a.type) for a in run.models} == {(f"checkpoint_trainable_{trial_id}", "model")}
        assert all(a.committed for a in run.models)
    # Trials spread over the three worker nodes: one logger per node, never the head's.
    assert {label for run in runs.values() for label in run.labels} == set(labels.values()) - {
        labels[str(cluster.head_node.node_id)]
    }
    assert DUMMY_KEY not in str([r.config for r in runs.values()])
    # Tune pickles its callbacks into the experiment folder: the key is not in there.
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or DUMMY_KEY.encode() not in path.read_bytes(), path
    assert_nothing_left()


def one_gpu_if_finishing(config: dict[str, Any]) -> dict[str, float]:
    """The trials that finish hold one GPU and no CPU (both on the GPU node); the failing ones a CPU."""
    return {"cpu": 0, "gpu": 1} if config["fail_at"] is None else {"cpu": 1}


def sized_trainable(config: dict[str, Any]) -> None:
    """``trainable`` as a function of its own (``tune.with_resources`` marks the function it is given)."""
    trainable(config)


def test_a_failing_trial_fails_its_run_while_the_others_finish_and_a_trial_judges_only_its_gpus(
    cluster: Any, gpu_node: ScriptedGpus, backend: WandbTestBackend, tmp_path: Any
) -> None:
    # (An experiment whose every trial fails: the first fit of test_restored_experiment_....)
    from ray import tune

    name = unique("tune-mixed")
    # The two trials that finish hold one GPU each of the GPU node; GPU 1 falls off the bus while
    # both run. Only the run of the trial holding it alerts: a trial's run judges its own GPUs.
    lose = {"path": str(gpu_node.path), "index": 1, "trials": 2, "after_s": 3.0}
    try:
        with sampled_markers(backend, name, tmp_path / "sampled") as sampled:
            space = {
                "x": tune.grid_search([0, 1]),
                "fail_at": tune.grid_search([2, None]),
                "lose_gpu": lose,
                "sampled_dir": sampled,
            }
            fn = tune.with_resources(sized_trainable, one_gpu_if_finishing)
            results = tuner(fn, name, str(tmp_path), space, make_callback(straggler_window_s=1.5)).fit()
    finally:
        gpu_node.write()  # GPU 1 back on the bus for the module's other tests
    runs = experiment_runs(backend, name)
    failed = {r.metrics["trial_id"] for r in results if r.error is not None}
    assert len(runs) == 4 and len(failed) == 2
    for trial_id, run in runs.items():
        assert len(run.completes) == 1
        assert (run.exit_codes[0] != 0) == (trial_id in failed)
    held = {r.metrics["trial_id"]: r.metrics["gpu"] for r in results if r.error is None}
    assert sorted(held.values()) == [0, 1]
    label = node_labels()[gpu_node.node_id]
    for trial_id, gpu in held.items():
        # Its GPU alerts: a straggler alert is the node rule's, which its 1.5 s window may raise of
        # the CPU noise of trials sharing 2 loaded cores; what is proved is which run names the GPU.
        titles = [a["title"] for a in runs[trial_id].alerts if a["title"].startswith("GPU ")]
        assert titles == ([f"GPU lost: {label} GPU 1"] if gpu == 1 else []), (gpu, titles)
    assert_nothing_left()


@pytest.mark.smoke
def test_a_trial_wrapping_a_torch_trainer_shows_its_workers_nodes(
    cluster: Any, backend: WandbTestBackend, tmp_path: Any
) -> None:
    name = unique("tune-train")
    callback = make_callback(upload_checkpoints=True)
    # Rank 1 stalls at the last step while rank 0 waits in the report: a hang of the trial's Train
    # run, named in the trial's run (hang_timeout_s=4 in the Train callback inside the trial). The
    # stall lasts until the hang alert is in the trial's run (an event, so the evidence is taken
    # while the rank is stuck however slow a loaded machine makes the detection: a fixed 10 s was
    # 4 s of limit, 0.25 s polls, up to 5 s of evidence and the alert's way to W&B, no margin
    # left); STALL_CEILING_S only ends a stall whose hang is never named, for the asserts to say so.
    with sampled_markers(backend, name, tmp_path / "markers") as markers:
        hung = os.path.join(markers, "hung")
        stall = {"step": REPORTS_AROUND_STALL - 1, "rank": 1, "seconds": STALL_CEILING_S, "until": hung}
        config = {"storage": str(tmp_path), "stall": stall, "hang_timeout_s": 4, "reports": REPORTS_AROUND_STALL}
        results = tuner(train_driver, name, str(tmp_path), config, callback).fit()
    assert not results.errors
    runs = experiment_runs(backend, name)
    assert len(runs) == 1
    run = next(iter(runs.values()))
    labels = node_labels()
    head = labels[str(cluster.head_node.node_id)]
    # The trial actor's node and both train workers' nodes: every worker node, not the head.
    assert run.labels == set(labels.values()) - {head}
    assert [row["step"] for row in user_rows(run)] == list(range(REPORTS_AROUND_STALL))
    assert all(row["rank"] == 0 for row in user_rows(run))
    assert run.exit_codes == [0]
    # The Train run's checkpoints reach the trial's run through the results' checkpoint_path.
    assert [a.files.get("step") for a in run.models] == [str(s).encode() for s in range(REPORTS_AROUND_STALL)]
    hangs = [a for a in run.alerts if a["title"].startswith("Hang")]
    assert [(a["severity"], a["title"].split(":")[0]) for a in hangs] == [("ERROR", "Hang"), ("INFO", "Hang over")]
    assert hangs[0]["title"] == "Hang: rank 1 stopped", hangs
    assert "rank 1 did not reach it" in hangs[0]["text"] and "in stalled_read (training.py:" in hangs[0]["text"]
    assert {f for f in run.files if f.startswith("hangs/hang-1/")} == {
        "hangs/hang-1/verdict.txt", "hangs/hang-1/rank-0.txt", "hangs/hang-1/rank-1.txt"
    }  # fmt: skip
    # The Train run inside did not open a W&B run of its own.
    assert not [r for r in backend.runs.values() if r.display_name and r.display_name.startswith(name + "-")]
    assert_nothing_left()


def test_restored_experiment_writes_to_the_same_runs(cluster: Any, backend: WandbTestBackend, tmp_path: Any) -> None:
    from ray import tune

    name = unique("tune-restore")
    space = {"x": tune.grid_search([0, 1]), "checkpoint": True, "fail_once_at": 2, "marker_dir": str(tmp_path)}
    first = tuner(trainable, name, str(tmp_path), space, make_callback()).fit()
    assert len(first.errors) == 2  # both raise at iteration 2: each trial's run ends failed
    runs_before = set(experiment_runs(backend, name))
    assert len(runs_before) == 2
    for run in experiment_runs(backend, name).values():
        assert len(user_rows(run)) == 2
        assert len(run.completes) == 1 and run.exit_codes[0] not in (0, None)

    restored = tune.Tuner.restore(os.path.join(str(tmp_path), name), trainable, resume_errored=True).fit()
    assert not restored.errors
    runs = experiment_runs(backend, name)
    assert set(runs) == runs_before
    for run in runs.values():
        assert [row["training_iteration"] for row in user_rows(run)] == list(range(1, ITERATIONS + 1))
        assert run.exit_codes[0] != 0 and run.exit_codes[-1] == 0
        assert len(run.completes) == 2
    assert_nothing_left()


class PluginFolderUnreadable(FSSpecHandler):  # type: ignore[misc]
    """Local files through a custom filesystem (as s3fs would be), except that nothing under a
    ``ray_wandb_nodes`` folder can be read back: a storage the driver side does not share."""

    def open_input_file(self, path: str) -> Any:
        if "/ray_wandb_nodes/" in path:
            raise OSError(f"not readable here: {path}")
        return super().open_input_file(path)


def test_offline_each_trial_gets_one_folder_with_its_node_run(
    cluster: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    import fsspec
    from pyarrow.fs import PyFileSystem
    from ray import tune

    from ray_wandb_nodes.report.summary import load

    with offline_backend(tmp_path, monkeypatch) as (wandb_dir, own_backend):
        name = unique("tune-offline")
        # A custom storage filesystem: "auto" sends each node's run through it. The nodes write
        # their copies, the driver side cannot read them back, so each comes through Ray instead
        # and the nodes delete what they wrote.
        storage = PyFileSystem(PluginFolderUnreadable(fsspec.filesystem("file")))
        results = tune.Tuner(
            trainable,
            param_space={"x": tune.grid_search([0, 1]), "sleep": 1.5},
            run_config=tune.RunConfig(
                name=name,
                storage_path=str(tmp_path),
                storage_filesystem=storage,
                callbacks=[make_callback(mode="offline")],
            ),
        ).fit()
        assert not results.errors and own_backend.requests == []
        assert "through Ray instead" in caplog.text and "not readable here" in caplog.text
        assert list((tmp_path / name / "ray_wandb_nodes").rglob("*.tar.gz")) == []
    folders = sorted((wandb_dir / "ray_wandb_nodes").iterdir())
    assert len(folders) == 2
    labels = node_labels()
    for folder in folders:
        index = json.loads((folder / "index.json").read_text())
        trial = next(r for r in results if r.metrics["trial_id"] == index["run_id"])
        trial_label = labels[trial.metrics["node_id"]]
        writers = {w["label"]: w for w in index["writers"]}
        assert writers[trial_label]["state"] == "collected" and index["exit_code"] == 0
        assert writers[trial_label]["via"] == "ray"
        (report,) = load(str(folder))
        assert report.history_rows == ITERATIONS
        nodes = {n.label: n for n in report.nodes}
        assert nodes[trial_label].samples >= 1  # short trials: the writer joins late
    assert_nothing_left()
