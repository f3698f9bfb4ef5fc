"""The Tune callback's pure parts: options, Ray-compatible result rows, artifacts, state."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest
import wandb

from ray_wandb_nodes import WandbNodesTuneCallback
from ray_wandb_nodes._config.values import OnHang
from ray_wandb_nodes._health import COLUMNS
from ray_wandb_nodes._run.tune_rows import tune_rows
from ray_wandb_nodes._wandb.artifacts import artifact_name, checkpoint_uri


def rows(result: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    kwargs.setdefault("excludes", ())
    kwargs.setdefault("log_config", False)
    return tune_rows(result, wandb=wandb, **kwargs)


# options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"upload_timeout": 0}, ["upload_timeout", "0"]),
        ({"upload_timeout": "1"}, ["upload_timeout", "'1'"]),
        ({"upload_checkpoints": "yes"}, ["upload_checkpoints", "'yes'"]),
        ({"video_kwargs": [1]}, ["video_kwargs", "[1]"]),
        ({"id": "same"}, ["id", "'same'", "trial id"]),
        ({"name": "n"}, ["name", "'n'", "trial"]),
        ({"nodes": "some"}, ["nodes", "'some'"]),
        ({"mode": "shared"}, ["mode", "'shared'"]),
        ({"sampling_interval_s": -1}, ["sampling_interval_s", "-1"]),
    ],
)
def test_invalid_tune_options_are_named(kwargs: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        WandbNodesTuneCallback(project="p", **kwargs)
    for text in names:
        assert text in str(info.value)


def test_positional_arguments_follow_rays_callback() -> None:
    cb = WandbNodesTuneCallback("proj", "grp", None, "k" * 40, ["a"], True, True, 30.0)
    assert (cb.options.project, cb.options.group, cb.options.excludes, cb.options.log_config) == (
        "proj",
        "grp",
        ("a",),
        True,
    )
    assert (cb.upload_checkpoints, cb.upload_timeout) == (True, 30.0)


def test_pickle_leaves_the_key_out_and_recaptures_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cb = WandbNodesTuneCallback(project="p", api_key="x" * 40)
    cb._run_ids["t1"] = "t1"
    data = pickle.dumps(cb)
    assert b"x" * 40 not in data
    monkeypatch.setenv("WANDB_API_KEY", "y" * 40)
    restored = pickle.loads(data)
    assert restored._env.api_key is not None and restored._env.api_key.reveal() == "y" * 40
    assert restored._run_ids == {"t1": "t1"}
    assert copy.deepcopy(cb)._env.api_key.reveal() == "x" * 40  # in-memory copies keep it


def test_state_keeps_run_ids_across_restore() -> None:
    cb = WandbNodesTuneCallback(project="p")
    cb._run_ids.update(a="a", b="b-old")
    fresh = WandbNodesTuneCallback(project="p")
    fresh.set_state(cb.get_state() or {})
    assert fresh._run_ids == {"a": "a", "b": "b-old"}


# result rows, as Ray's WandbLoggerCallback makes them ----------------------------------------------


def test_numbers_flattened_auto_keys_to_config_strings_left_out() -> None:
    result = {
        "loss": 0.5,
        "nested": {"acc": 1},
        "trial_id": "abc_00001",
        "hostname": "vm",
        "node_ip": "10.0.0.1",
        "pid": 7,
        "date": "2026-11-30",
        "done": False,
        "should_checkpoint": True,
        "checkpoint_dir_name": "checkpoint_000001",
        "phase": "warmup",
        "training_iteration": 3,
        "config": {"lr": 0.1},
    }
    row, config, skipped = rows(result)
    assert row == {"loss": 0.5, "nested/acc": 1, "training_iteration": 3}
    assert config == {
        "lr": 0.1,
        "trial_id": "abc_00001",
        "hostname": "vm",
        "node_ip": "10.0.0.1",
        "pid": 7,
        "date": "2026-11-30",
    }
    assert skipped == ["phase (a str, not a number or media)"]


def test_log_config_logs_config_values_too_and_excludes_apply() -> None:
    row, _, _ = rows({"config": {"lr": 0.1, "w": 2}, "a": 1, "b": 2}, log_config=True, excludes=["b", "config/w"])
    assert row == {"config/lr": 0.1, "a": 1}


def test_arrays_become_images_and_videos() -> None:
    result = {
        "img": np.zeros((8, 8, 3), dtype=np.uint8),
        "imgs": np.zeros((2, 8, 8, 3), dtype=np.uint8),
        "one": np.zeros((1, 8, 8, 3), dtype=np.uint8),
        "vid": np.zeros((1, 4, 3, 8, 8), dtype=np.uint8),
        "scalar_array": np.array([2.5]),
        "vector": np.arange(3),
    }
    row, _, skipped = rows(result)
    assert isinstance(row["img"], wandb.Image) and isinstance(row["one"], wandb.Image)
    assert [type(v) for v in row["imgs"]] == [wandb.Image, wandb.Image]
    assert isinstance(row["vid"], wandb.Video)
    assert row["scalar_array"] == np.array([2.5])
    assert skipped == ["vector (a ndarray, not a number or media)"]


def test_media_that_cannot_be_made_is_left_out_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_moviepy(*args: Any, **kwargs: Any) -> Any:
        raise wandb.Error("wandb.Video requires moviepy when passing raw data")

    monkeypatch.setattr(wandb, "Video", no_moviepy)
    row, _, skipped = rows({"vid": np.zeros((1, 4, 3, 8, 8), dtype=np.uint8), "loss": 1.0})
    assert row == {"loss": 1.0}
    assert skipped == ["vid (Error: wandb.Video requires moviepy when passing raw data)"]


# artifacts ----------------------------------------------------------------------------------------


def test_local_checkpoints_are_uploaded_remote_ones_referenced() -> None:
    assert checkpoint_uri(pafs.LocalFileSystem(), "/tmp/ckpt") is None
    assert checkpoint_uri(None, "/tmp/ckpt") is None
    assert checkpoint_uri(pafs.SubTreeFileSystem("/tmp", pafs.LocalFileSystem()), "x") == "subtree://x"
    fsspec = pytest.importorskip("fsspec")
    memory = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    assert checkpoint_uri(memory, "/bucket/ckpt") == "memory://bucket/ckpt"


def test_remote_checkpoint_becomes_a_reference_even_without_storage_libraries(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from ray_wandb_nodes._wandb.artifacts import checkpoint_artifact

    remote = checkpoint_artifact(
        wandb,
        name="checkpoint_t",
        checkpoint=SimpleNamespace(
            path="bucket/run/checkpoint_000002", filesystem=pafs.S3FileSystem(anonymous=True, region="us-east-1")
        ),
    )
    assert {p: e.ref for p, e in remote.manifest.entries.items()} == {
        "checkpoint_000002": "s3://bucket/run/checkpoint_000002"
    }
    (tmp_path / "model.pt").write_text("weights")
    local = checkpoint_artifact(
        wandb, name="checkpoint_t", checkpoint=SimpleNamespace(path=str(tmp_path), filesystem=pafs.LocalFileSystem())
    )
    assert list(local.manifest.entries) == ["model.pt"] and local.manifest.entries["model.pt"].ref is None
    assert local.type == "model"


def test_artifact_names_are_what_wandb_accepts() -> None:
    assert artifact_name("checkpoint_trainable_abc_00001") == "checkpoint_trainable_abc_00001"
    assert artifact_name("checkpoint_f(x=1, y=2)") == "checkpoint_f-x-1-y-2"


# a trial's node table ---------------------------------------------------------------------------
def test_a_trials_table_is_logged_while_it_runs_and_at_its_end_only_on_a_change() -> None:
    from ray_wandb_nodes._health import HealthOptions
    from ray_wandb_nodes._run.tune_run import TrialHealth
    from tests.support.fakes import summary

    now = [1000.0]
    health = TrialHealth(HealthOptions(compare_all=True), clock=lambda: now[0])
    assert health.tick().table is None  # no node known yet
    health.set_nodes({"n1": ("node-a-1", "a")}, {})
    started = health.tick()  # as soon as the trial's node is known
    assert [row[:4] for row in started.table or []] == [["node-a-1", "a", "", "ok"]]
    assert started.stragglers == 0
    assert health.tick().table is None  # nothing new
    now[0] += 1
    health.summary("n1", summary(now[0], cpu=42.0, mem=10.0))
    sampled = health.tick()  # again once the node has sampled: its values
    assert sampled.table is not None and dict(zip(COLUMNS, sampled.table[0], strict=True))["cpu"] == 42.0
    now[0] += 1
    assert health.tick(final=True).table is None  # the end says what the last table said

    changed = TrialHealth(HealthOptions(compare_all=True), clock=lambda: now[0])
    assert changed.tick(final=True).table is not None  # a run without a table gets one at its end
    changed.set_nodes({"n1": ("node-a-1", "a")}, {})
    assert changed.tick().table is not None
    changed.set_nodes({}, {})  # the trial moved off its node: a state the last table did not say
    end = changed.tick(final=True)
    assert [row[3] for row in end.table or []] == ["left"]


# a trial's start and end on the driver ----------------------------------------------------------
def test_a_trials_mark_is_cleared_off_the_hook_and_a_retried_trial_keeps_its_new_mark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from ray_wandb_nodes._run import handoff as _handoff
    from ray_wandb_nodes._run.tune_run import TrialMarks
    from ray_wandb_nodes._warn import Warner

    store: dict[str, str] = {}
    cleared_on: list[str] = []
    gate = threading.Event()

    def clear(trial_id: str) -> None:
        gate.wait(5)  # a slow GCS call
        cleared_on.append(threading.current_thread().name)
        store.pop(trial_id, None)

    monkeypatch.setattr(_handoff, "mark_trial", lambda trial_id, mark: store.__setitem__(trial_id, mark.run_id))
    monkeypatch.setattr(_handoff, "clear_trial", clear)
    marks = TrialMarks(Warner())
    marks.mark("t1", "run-1")
    marks.mark("t2", "run-2")
    marks.clear("t1")  # returns while the delete waits
    marks.clear("t2")
    assert store == {"t1": "run-1", "t2": "run-2"}
    gate.set()
    marks.mark("t2", "run-2")  # t2 retried before its old mark was cleared: the clear is skipped
    marks.close(5)
    assert store == {"t2": "run-2"}
    assert cleared_on == ["ray_wandb_nodes-tune-marks"]


def test_a_trials_end_ends_its_run_once_and_returns_at_once() -> None:
    import threading
    from types import SimpleNamespace

    from ray_wandb_nodes._run.tune_run import TuneRuns

    class Session:
        finishing = False
        codes: list[int] = []
        retired = threading.Event()  # set by the fleet once it has taken the run's end
        finish_timeout_s = 1.0

        def finish(self, exit_code: int) -> None:
            self.finishing = True
            self.codes.append(exit_code)

    cleared: list[tuple[str, threading.Event | None]] = []
    runs = object.__new__(TuneRuns)  # no Ray: only the bookkeeping of ends
    runs.sessions = {"t1": Session()}  # type: ignore[dict-item]
    runs.marks = SimpleNamespace(clear=lambda trial_id, after, within: cleared.append((trial_id, after)))  # type: ignore[assignment]
    runs.end("t1", 1)
    runs.end("t1", 0)  # the experiment's end after the trial's error: the first end counts
    runs.end("gone", 0)
    assert Session.codes == [1] and cleared == [("t1", Session.retired)]  # the mark outlives the run's end


def test_a_trials_rows_send_only_the_config_that_changed() -> None:
    from ray_wandb_nodes._run.tune_run import _new_config_only

    build = _new_config_only(lambda result: rows(result))
    first = {"score": 1, "trial_id": "t1", "date": "d1", "config": {"lr": 0.1}}
    row, config, _ = build(first)
    assert row == {"score": 1} and config == {"lr": 0.1, "trial_id": "t1", "date": "d1"}
    row, config, _ = build({**first, "score": 2})
    assert row == {"score": 2} and config == {}  # Tune's auto-filled keys, unchanged: not sent again
    _, config, _ = build({**first, "score": 3, "date": "d2", "config": {"lr": 1}})
    assert config == {"date": "d2", "lr": 1}  # 1 is not 0.1, and an int is not a float
    # A value that cannot be compared (an array, from a row builder of one's own) is sent again.
    arrays = _new_config_only(lambda result: ({}, {"a": np.zeros(2)}, []))
    assert [list(arrays({})[1]) for _ in range(2)] == [["a"], ["a"]]


def test_a_trials_node_gets_its_logger_before_its_run_exists_and_keeps_it() -> None:
    from dataclasses import replace

    from bench.fleet_scale import Quiet, SimCluster, make_target
    from ray_wandb_nodes._config.values import NodeSelection
    from ray_wandb_nodes._fleet.commands import AddRun, RunReady, SetNodes
    from ray_wandb_nodes._fleet.fleet import NodeFleet
    from tests.support.fakes import Clock

    clock = Clock()
    sim = SimCluster(3, clock)
    fleet = NodeFleet(init_timeout_s=90.0, warner=Quiet(), list_nodes=sim.list_nodes, actors=sim, clock=clock)  # type: ignore[arg-type]
    node_a, node_b, _ = list(sim.alive)
    other = make_target(clock)  # a trial running on node b, its run created
    other.selection, other.nodes = NodeSelection.WORKERS, {node_b}
    trial = make_target(clock)  # a trial just started on node a: wandb.init still runs
    trial.primary.spec = replace(trial.primary.spec, init_kwargs={**trial.primary.spec.init_kwargs, "id": "trial-a"})
    trial.selection, trial.ready = NodeSelection.WORKERS, False
    fleet.step(AddRun(other))
    fleet.step(AddRun(trial))
    fleet.step(SetNodes(trial.run_id, {node_a}, None, trial))
    assert sorted(sim.created_at) == sorted([node_a, node_b])  # node a's logger starts now
    assert fleet.worker.pool.runs_by_node() == {node_a: set(), node_b: {other.run_id}}
    fleet.step(RunReady(trial))  # the run exists: its writer joins the logger already there
    assert fleet.worker.pool.runs_by_node() == {node_a: {"trial-a"}, node_b: {other.run_id}}
    assert sim.changes == 4  # two loggers (an actor and a placement group each), none killed


def test_a_writers_finish_wakes_the_fleet_at_once() -> None:
    import threading
    from concurrent.futures import Future

    from ray_wandb_nodes._fleet.retire import Retirement

    class Ref:  # as Ray's ObjectRef: a future of its value
        def __init__(self) -> None:
            self.fut: Future[Any] = Future()

        def future(self) -> Future[Any]:
            return self.fut

    refs = [Ref(), Ref()]
    r = Retirement("run", {ref: None for ref in refs}, 0.0, 1.0, None, threading.Event())  # type: ignore[misc]
    woken: list[int] = []
    r.wake_on_each_finish(lambda: woken.append(1))
    assert woken == []
    refs[0].fut.set_result({"runs": []})
    assert woken == [1]
    refs[1].fut.set_exception(RuntimeError("the logger died"))  # a failed finish wakes it too
    assert woken == [1, 1]


def test_a_trials_run_reads_the_train_runs_finished_ranks_and_its_mark_outlives_the_runs_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from bench.fleet_scale import Clock, make_target
    from ray_wandb_nodes._fleet import HangSetting
    from ray_wandb_nodes._fleet.targets import relayed_nodes
    from ray_wandb_nodes._hang import HangTimeout
    from ray_wandb_nodes._run import handoff as _handoff
    from ray_wandb_nodes._run.tune_run import TrialMarks, TrialRelayed
    from ray_wandb_nodes._warn import Warner

    places = (_handoff.WorkerPlace("n1", "h1", 0), _handoff.WorkerPlace("n2", "h2", 1))
    monkeypatch.setattr(_handoff, "trial_workers", lambda trial_id: _handoff.TrialWorkers(places, "t1.a1.0badcafe"))
    monkeypatch.setattr(_handoff, "hang_setting", lambda trial_id: HangSetting(HangTimeout(4.0), OnHang.ALERT))
    monkeypatch.setattr(_handoff, "attempt_state", lambda trial_id: _handoff.AttemptState(frozenset({1}), 3))
    monkeypatch.setattr(_handoff, "trial_failures", lambda trial_id: _handoff.TrialFailures())
    target = make_target(Clock())  # the trial's run, on the fleet thread
    target.relay = TrialRelayed("t1")
    assert relayed_nodes(target, Warner()) == {"n1", "n2"}
    assert target.relayed_ranks == {"n1": (0,), "n2": (1,)}  # watched for how they end, too
    assert target.hangs is not None and target.hangs.finished == frozenset({1})
    assert target.hangs.checkpoint_reports == 3
    assert target.hangs.ranks == {"n1": (0,), "n2": (1,)} and target.attempt == "t1.a1.0badcafe"

    cleared: list[str] = []
    monkeypatch.setattr(_handoff, "mark_trial", lambda trial_id, run_id: None)
    monkeypatch.setattr(_handoff, "clear_trial", cleared.append)
    marks = TrialMarks(Warner())
    retired = threading.Event()
    marks.clear("t1", after=retired, within=30.0)  # the fleet has not taken the run's end yet
    marks.clear("t2", after=threading.Event(), within=0.0)  # bounded: cleared when its time is up
    assert not retired.wait(0.3) and cleared == []
    retired.set()
    marks.close(5)
    assert cleared == ["t1", "t2"]


def test_the_attempts_state_crosses_the_hand_off_as_one_typed_value() -> None:
    from ray_wandb_nodes._run.handoff import AttemptState

    state = AttemptState(frozenset({3, 1}), 7)
    assert AttemptState.from_json(state.to_json()) == state
    assert state.to_json() == b'{"finished": [1, 3], "checkpoint_reports": 7}'
    assert AttemptState.from_json(None) == AttemptState() == AttemptState(frozenset(), 0)
