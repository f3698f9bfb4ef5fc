"""The primary writer against the real wandb client and the test backend, without a Ray cluster:
an abort ends within its own bound while a checkpoint upload stalls, rank-0 rows never wait
behind building a checkpoint's artifact, a checkpoint is never copied on the controller's
node, and one that Ray deletes before its upload ends (``num_to_keep``) is never a version and
is named in a warning. (The main strategy has no node writer, so no Ray cluster is needed.)"""

from __future__ import annotations

import os
import shutil
import threading
import time
from types import SimpleNamespace
from typing import Any

import pyarrow.fs as pafs
import pytest

from ray_wandb_nodes._config.options import build_options
from ray_wandb_nodes._config.secrets import capture_env
from ray_wandb_nodes._config.values import Mode
from ray_wandb_nodes._ray import TrainStart
from ray_wandb_nodes._run.train_run import ABORT_S, TrainRun
from ray_wandb_nodes._warn import Warner
from tests.support.env import FAST
from tests.support.runs import unique
from tests.support.wait import wait_until
from tests.support.wandb_backend import WandbTestBackend


def checkpoint(folder: Any, size: int = 1 << 16) -> Any:
    folder.mkdir(exist_ok=True)
    (folder / "model.pt").write_bytes(os.urandom(size))
    return SimpleNamespace(path=str(folder), filesystem=pafs.LocalFileSystem())


def main_run(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, **options: Any) -> TrainRun:
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [])  # no cluster: the main strategy needs no node
    o = build_options(
        strategy="main", project="end-bounds", sampling_interval_s=0.5, wandb_init_kwargs={"settings": FAST}, **options
    )
    start = TrainStart(
        run_name=name,
        storage_path=str(tmp_path / "storage"),
        train_loop_config=None,
        num_workers=1,
        use_gpu=False,
        experiment_fs_path=None,
        storage_filesystem=None,
        score_attribute=None,
        score_order="max",
    )
    env = capture_env(os.environ)
    return TrainRun(o, env, Warner(), start=start, node_id="c" * 56, hostname="head", driver_cwd=str(tmp_path))


def test_an_abort_ends_within_its_bound_while_a_checkpoint_upload_stalls(
    backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("abort-upload")
    bound = 3.0  # the abort's: ABORT_S, or finish_timeout_s when shorter
    assert bound < ABORT_S
    run = main_run(tmp_path, monkeypatch, name, upload_checkpoints=True, upload_timeout=600, finish_timeout_s=bound)
    primary = run.sessions[run.base_id].primary  # type: ignore[attr-defined]
    wait_until(lambda: primary.ready, 60, "the run to exist", every_s=0.05)
    # Every upload of the checkpoint's file stalls for longer than the abort may take.
    backend.faults.add(delay_s=bound + 6, path_contains="/artifact-file/")
    try:
        run.report([{"loss": 1.0}], checkpoint(tmp_path / "ckpt"))
        wait_until(
            lambda: any(m == "PUT" and "/artifact-file/" in p for m, p, _ in list(backend.requests)),
            30,
            "the checkpoint's upload to start",
            every_s=0.05,
        )
        started = time.monotonic()
        run.abort()
        took = time.monotonic() - started
    finally:
        backend.faults.clear()
    # The upload stalls bound + 6 s: an abort that waited on it would take that. 3 s over the bound
    # leave the abort's own end (the writer thread's join, the warning) room on 2 loaded cores.
    assert took <= bound + 3.0, f"the abort took {took:.1f}s"
    said = [r.getMessage() for r in caplog.records if "aborted" in r.getMessage()]
    assert len(said) == 1 and f"checkpoint-{run.base_id}" in said[0] and "within 3s" in said[0], said


def test_rank0_rows_never_wait_behind_building_a_checkpoint_artifact(
    backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray_wandb_nodes._run.primary import PrimaryWriter

    name = unique("rows-and-artifact")
    run = main_run(tmp_path, monkeypatch, name, upload_checkpoints=True, finish_timeout_s=30)
    primary: PrimaryWriter = run.sessions[run.base_id].primary  # type: ignore[attr-defined]
    wait_until(lambda: primary.ready, 60, "the run to exist", every_s=0.05)
    building, release = threading.Event(), threading.Event()

    def slow_build(wandb: Any) -> Any:  # hashing a multi-GB checkpoint, as long as the test wants
        building.set()
        release.wait(60)
        artifact = wandb.Artifact(name=f"checkpoint-{run.base_id}", type="model")
        artifact.add_dir(str(checkpoint(tmp_path / "ckpt").path), skip_cache=True, policy="immutable")
        return artifact

    primary.log_artifact(slow_build, aliases=["latest"], name="slow")
    wait_until(building.is_set, 10, "the artifact's build to start", every_s=0.05)
    for step in range(3):
        run.report([{"step": step}], None)
    try:
        wait_until(lambda: primary.logged == 3, 10, "the rows logged while the artifact is being built", every_s=0.05)
    finally:
        release.set()
    run.finish(exit_code=0, timeout=30)
    (record,) = [r for r in backend.runs.values() if r.display_name == name]
    assert [row["step"] for row in record.history if "step" in row] == [0, 1, 2]
    assert record.exit_codes == [0] and [a.name for a in record.models] == [f"checkpoint-{run.base_id}"]


def test_a_checkpoint_is_uploaded_from_where_it_is_never_copied(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    from ray_wandb_nodes._wandb.artifacts import checkpoint_artifact

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))  # wandb's staging folder is under it
    ckpt = checkpoint(tmp_path / "ckpt")
    artifact = checkpoint_artifact(wandb, name="checkpoint-x", checkpoint=ckpt)
    entry = artifact.manifest.entries["model.pt"]
    assert entry.local_path == os.path.join(ckpt.path, "model.pt")  # no staging copy
    assert entry.skip_cache  # and no copy into wandb's cache after the upload
    staged = [f for _, _, files in os.walk(tmp_path / "data") for f in files]
    assert staged == []


def test_a_checkpoint_ray_deletes_before_its_upload_ends_is_never_a_version_and_is_named(
    backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("num-to-keep")
    run = main_run(tmp_path, monkeypatch, name, upload_checkpoints=True, finish_timeout_s=30)
    primary = run.sessions[run.base_id].primary  # type: ignore[attr-defined]
    wait_until(lambda: primary.ready, 60, "the run to exist", every_s=0.05)
    # Slow uploads: for 3 s, W&B answers where an artifact's files go only 3 s later (so a
    # node table's artifact, if one comes first, cannot take the slowness off the checkpoint's).
    backend.faults.add(delay_s=3, operation="CreateArtifactFiles", duration_s=3)
    first, second = checkpoint(tmp_path / "checkpoint_0"), checkpoint(tmp_path / "checkpoint_1")
    contents = [(tmp_path / f"checkpoint_{i}" / "model.pt").read_bytes() for i in (0, 1)]
    run.report([{"loss": 2.0}], first)
    wait_until(
        lambda: any(a.name == f"checkpoint-{run.base_id}" for a in list(backend.artifacts.values())),
        30,
        "the first checkpoint's upload to start",
        every_s=0.02,
    )
    # The second checkpoint comes quickly; with num_to_keep=1 Ray deletes the first as it registers.
    shutil.rmtree(first.path)
    started = time.monotonic()
    run.report([{"loss": 1.0}], second)
    assert time.monotonic() - started < 0.5  # training never waits on an upload
    run.finish(exit_code=0, timeout=30)

    (record,) = [r for r in backend.runs.values() if r.display_name == name]
    listed = [a for a in record.models if a.committed]  # W&B lists committed versions only
    for version in listed:  # each whole: every file its manifest names, as the checkpoint held it
        assert sorted(version.files) == sorted(version.manifest["contents"]) == ["model.pt"], version
    said = [r.getMessage() for r in caplog.records if "is not a version of the artifact" in r.getMessage()]
    for i, (folder, content) in enumerate([(first, contents[0]), (second, contents[1])]):
        kept = [v for v in listed if v.files["model.pt"] == content]
        named = [m for m in said if f"checkpoint {i} ({folder.path})" in m]
        assert len(kept) + len(named) == 1, (i, kept, said)  # a whole version, or one warning
    assert [v.files["model.pt"] for v in listed] == [contents[1]]  # the first was the one cut short
    assert "latest" in listed[0].aliases
    (warning,) = said
    assert "num_to_keep" in warning and "raise num_to_keep or checkpoint less often" in warning, warning


def test_a_checkpoint_deleted_before_or_while_its_artifact_is_built_is_never_built(tmp_path: Any) -> None:
    import wandb

    from ray_wandb_nodes._wandb.artifacts import CheckpointGoneError, checkpoint_artifact, still_whole

    gone = checkpoint(tmp_path / "gone")
    shutil.rmtree(gone.path)  # Ray deleted it before the artifact thread got to it
    with pytest.raises(CheckpointGoneError, match="folder was deleted before its files were read"):
        checkpoint_artifact(wandb, name="checkpoint-x", checkpoint=gone)
    # A listing taken while Ray deleted the folder: a file it names is gone by the time it is checked.
    partial = checkpoint(tmp_path / "partial")
    artifact = checkpoint_artifact(wandb, name="checkpoint-x", checkpoint=partial)
    os.remove(os.path.join(partial.path, "model.pt"))
    with pytest.raises(CheckpointGoneError, match="1 of its files vanished"):
        still_whole(artifact, partial.path)
    whole = checkpoint(tmp_path / "whole")
    still_whole(checkpoint_artifact(wandb, name="checkpoint-x", checkpoint=whole), whole.path)  # raises nothing


def test_the_warning_of_a_skipped_checkpoint_names_it_why_and_the_fix() -> None:
    from ray_wandb_nodes._wandb.uploads import Upload

    upload = Upload("checkpoint-abc", ("latest",), 3, "/s/run/checkpoint_2026")
    said = upload.skipped("W&B did not commit its upload (ValueError: uploads failed)", gone=True)
    assert said.startswith("checkpoint 3 (/s/run/checkpoint_2026) is not a version of the artifact checkpoint-abc")
    assert "ValueError: uploads failed" in said and "raise num_to_keep or checkpoint less often" in said
    other = upload.skipped("W&B did not commit its upload (ValueError: 500)", gone=False)  # not Ray's deletion
    assert "num_to_keep" not in other and other.endswith("(ValueError: 500)")


def test_an_upload_wandb_did_not_commit_is_named_once_and_an_offline_run_waits_on_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ray_wandb_nodes._wandb.uploads import ArtifactUploads, Upload

    class Logged:  # what run.log_artifact returns: wait() raises what wandb-core answered
        def wait(self) -> None:
            raise ValueError("ArtifactSaver.uploadFiles: most remaining uploads (1/1) have failed, giving up")

    def fake_run(offline: bool) -> Any:
        return SimpleNamespace(offline=offline, log_artifact=lambda artifact, aliases: Logged())

    for offline in (True, False):
        uploads = ArtifactUploads(lambda artifact, upload: None, threading.Event(), Warner())
        upload = Upload("checkpoint-r", ("latest",), 0, "/gone/checkpoint_0")
        uploads.log(fake_run(offline), object(), upload)
        uploads.finished(5.0)
        assert not uploads.pending
    said = [r.getMessage() for r in caplog.records if "is not a version" in r.getMessage()]
    assert len(said) == 1, said  # online only: offline, wandb uploads nothing to answer for
    assert "checkpoint 0 (/gone/checkpoint_0)" in said[0] and "uploads (1/1) have failed" in said[0]
    assert "raise num_to_keep" in said[0]  # its folder is gone: Ray's deletion, and the fix


def test_the_node_strategy_s_checkpoint_ray_deletes_before_its_upload_ends_is_never_a_version_and_is_named(
    backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The node strategy's run is written by the rank's node logger: that actor's code, run here in
    # this process (no Ray: the node id it reports is all it asks of Ray), through the real wandb.
    import ray

    from ray_wandb_nodes._fleet.node_logger import NodeLogger
    from ray_wandb_nodes._wandb.writers import run_spec
    from tests.support.fleets import one_node_pool

    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1"))
    name = unique("node-num-to-keep")
    kwargs = {"settings": FAST}
    o = build_options(strategy="node", project="end-bounds", upload_checkpoints=True, wandb_init_kwargs=kwargs)
    env = capture_env(os.environ)
    spec = run_spec(o, env, mode=Mode.ONLINE, run_id=name, name=name, group=None, label="node-a", config={})
    logger = NodeLogger()
    assert logger.add_writer(spec).errors == {}
    artifact = f"checkpoint-{name}"
    backend.faults.add(delay_s=3, operation="CreateArtifactFiles", duration_s=3)  # slow uploads, as above
    first, second = checkpoint(tmp_path / "checkpoint_0"), checkpoint(tmp_path / "checkpoint_1")
    contents = [(tmp_path / f"checkpoint_{i}" / "model.pt").read_bytes() for i in (0, 1)]
    started = time.monotonic()
    logger.log_artifact(name, first, artifact, ["latest"])
    # The actor's call never waits on building an artifact: the upload is held 3 s (as above), a call
    # that waited would take 3 s or more.
    assert time.monotonic() - started < 2.0
    wait_until(
        lambda: any(a.name == artifact for a in list(backend.artifacts.values())),
        30,
        "the first checkpoint's upload to start",
        every_s=0.02,
    )
    shutil.rmtree(first.path)  # num_to_keep=1: Ray deletes the first as the second registers
    logger.log_artifact(name, second, artifact, ["latest"])
    status = logger.finish(name, exit_code=0)

    (record,) = [r for r in backend.runs.values() if r.display_name == name]
    assert record.exit_codes == [0]
    listed = [a for a in record.models if a.committed]
    for version in listed:  # each whole
        assert sorted(version.files) == sorted(version.manifest["contents"]) == ["model.pt"], version
    assert [v.files["model.pt"] for v in listed] == [contents[1]] and "latest" in listed[0].aliases
    # One warning naming the first, said on the driver side as the logger's status comes in.
    _, pool, handle = one_node_pool()
    pool.check_status(handle, status)
    pool.check_status(handle, status)  # every ping carries it: said once
    said = [r.getMessage() for r in caplog.records if "is not a version of the artifact" in r.getMessage()]
    assert len(said) == 1, said
    assert f"checkpoint 0 ({first.path}) is not a version of the artifact {artifact}" in said[0]
    assert "raise num_to_keep or checkpoint less often" in said[0]
