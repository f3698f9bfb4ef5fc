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
from ray_wandb_nodes._artifacts import artifact_name, checkpoint_uri
from ray_wandb_nodes._health.monitor import COLUMNS
from ray_wandb_nodes._tune_rows import tune_rows


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

    from ray_wandb_nodes._artifacts import checkpoint_artifact

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
    from ray_wandb_nodes._tune_run import TrialHealth

    now = [1000.0]
    health = TrialHealth(HealthOptions(compare_all=True), clock=lambda: now[0])
    assert health.tick().table is None  # no node known yet
    health.set_nodes({"n1": ("node-a-1", "a")}, {})
    started = health.tick()  # as soon as the trial's node is known
    assert [row[:4] for row in started.table or []] == [["node-a-1", "a", "", "ok"]]
    assert started.stragglers == 0
    assert health.tick().table is None  # nothing new
    now[0] += 1
    health.summary("n1", {"t": now[0], "cpu": 42.0, "memory_percent": 10.0})
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
