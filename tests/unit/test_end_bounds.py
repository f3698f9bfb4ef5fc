"""The primary writer against the real wandb client and the test backend, without a Ray cluster:
an abort ends within its own bound while a checkpoint upload stalls, rank-0 rows never wait
behind building a checkpoint's artifact, and a checkpoint is never copied on the controller's
node. (The main strategy has no node writer, so no Ray cluster is needed.)"""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import pyarrow.fs as pafs
import pytest

from ray_wandb_nodes._options import build_options
from ray_wandb_nodes._ray import TrainStart
from ray_wandb_nodes._secrets import capture_env
from ray_wandb_nodes._train_run import ABORT_S, TrainRun
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
    assert took <= bound + 0.5, f"the abort took {took:.1f}s"
    said = [r.getMessage() for r in caplog.records if "aborted" in r.getMessage()]
    assert len(said) == 1 and f"checkpoint-{run.base_id}" in said[0] and "within 3s" in said[0], said


def test_rank0_rows_never_wait_behind_building_a_checkpoint_artifact(
    backend: WandbTestBackend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray_wandb_nodes._primary import PrimaryWriter

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

    from ray_wandb_nodes._artifacts import checkpoint_artifact

    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))  # wandb's staging folder is under it
    ckpt = checkpoint(tmp_path / "ckpt")
    artifact = checkpoint_artifact(wandb, name="checkpoint-x", checkpoint=ckpt)
    entry = artifact.manifest.entries["model.pt"]
    assert entry.local_path == os.path.join(ckpt.path, "model.pt")  # no staging copy
    assert entry.skip_cache  # and no copy into wandb's cache after the upload
    staged = [f for _, _, files in os.walk(tmp_path / "data") for f in files]
    assert staged == []
