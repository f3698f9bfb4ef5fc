"""One writer's offline run into its W&B run: the command and environment of each role, each run
of a folder once, within a deadline, and what failed in one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ray_wandb_nodes._config.secrets import Secret
from ray_wandb_nodes._wandb.sync import SyncInto, offline_runs, sync_command, sync_environment, sync_folder
from ray_wandb_nodes._wandb.txlog import BLOCK_SIZE, read_run
from ray_wandb_nodes._wandb.writers import Role
from tests.support.offline import offline_run

__all__ = ["offline_run"]  # the shared fixture, imported for pytest to find

INTO = SyncInto("r1", Role.NODE, "proj", "team", "https://wandb.corp", Secret("k" * 40))


def offline_folder(folder: Path, name: str, synced: bool = False) -> Path:
    run = folder / "wandb" / name
    run.mkdir(parents=True)
    (run / f"run-{name}.wandb").write_bytes(b"x")
    if synced:
        (run / f"run-{name}.wandb.synced").touch()
    return run


class Runner:
    """``subprocess.run`` as the test scripts it: marks each run synced (or not) and notes the call."""

    def __init__(self, *, code: int = 0, mark: bool = True, raises: BaseException | None = None) -> None:
        self.code, self.mark, self.raises = code, mark, raises
        self.calls: list[tuple[list[str], dict[str, str], float]] = []

    def __call__(self, cmd: list[str], *, env: dict[str, str], timeout: float, **_: Any) -> Any:
        self.calls.append((cmd, env, timeout))
        if self.raises is not None:
            raise self.raises
        path = Path(cmd[-1])
        if self.mark:
            (path / f"{next(path.glob('*.wandb')).name}.synced").touch()
        return subprocess.CompletedProcess(cmd, self.code, "", "line 1\nerror: 403 Forbidden\n")


def test_each_role_is_synced_as_shared_mode_wrote_it() -> None:
    from ray_wandb_nodes._wandb.sync import _skips_online

    # An online folder (a relayed writer whose relay died) is synced too, where wandb would skip it.
    online = ["--no-skip-online"] if _skips_online() else []
    wandb_sync = [sys.executable, "-m", "wandb", "beta", "sync", "--id", "r1", *online]
    assert sync_command("/f", "r1", "p", None) == [*wandb_sync, "--project", "p", "/f"]
    node = sync_environment(Role.NODE, {"WANDB_MODE": "offline", "HOME": "/root"})
    assert node == {"WANDB_MODE": "shared", "WANDB_X_PRIMARY": "false", "WANDB_X_UPDATE_FINISH_STATE": "false"} | {
        "HOME": "/root"
    }
    assert sync_environment(Role.PRIMARY, {})["WANDB_X_PRIMARY"] == "true"
    assert sync_environment(Role.RUN, {"WANDB_MODE": "offline"}) == {}  # a run of its own: wandb's default


def test_a_nodes_runs_go_into_the_run_with_its_host_and_key_once_each(tmp_path: Path) -> None:
    offline_folder(tmp_path, "offline-run-2")
    offline_folder(tmp_path, "offline-run-1", synced=True)  # went up before: not again
    (tmp_path / "wandb" / "latest-run").symlink_to(tmp_path / "wandb" / "offline-run-2")
    assert [Path(p).name for p in offline_runs(str(tmp_path))] == ["offline-run-1", "offline-run-2"]
    runner = Runner()
    environ = {
        "WANDB_API_KEY": "the driver's",
        "WANDB_BASE_URL": "http://elsewhere",
        "WANDB_PROJECT": "x",
        "PATH": "/b",
    }
    assert sync_folder(INTO, str(tmp_path), time.monotonic() + 30, environ=environ, runner=runner) is None
    ((cmd, env, timeout),) = runner.calls
    assert cmd[-5:] == ["--project", "proj", "--entity", "team", str(tmp_path / "wandb" / "offline-run-2")]
    assert env["WANDB_BASE_URL"] == "https://wandb.corp" and env["WANDB_API_KEY"] == "k" * 40
    assert "WANDB_PROJECT" not in env and env["PATH"] == "/b" and env["WANDB_MODE"] == "shared"
    assert 0 < timeout <= 30
    assert "k" * 40 not in repr(INTO)


def test_what_failed_is_said_in_one_line_and_nothing_waits_past_the_deadline(tmp_path: Path) -> None:
    assert sync_folder(INTO, str(tmp_path), time.monotonic() + 30, runner=Runner()) == f"no offline run in {tmp_path}"
    offline_folder(tmp_path, "offline-run-1")
    failed = sync_folder(INTO, str(tmp_path), time.monotonic() + 30, environ={}, runner=Runner(code=1, mark=False))
    assert failed == "wandb sync exited 1: line 1 | error: 403 Forbidden"
    late = Runner(raises=subprocess.TimeoutExpired("wandb", 3))
    assert "did not finish within" in str(
        sync_folder(INTO, str(tmp_path), time.monotonic() + 3, environ={}, runner=late)
    )
    gone = Runner()
    assert (
        sync_folder(INTO, str(tmp_path), time.monotonic() - 1, environ={}, runner=gone) == "no time was left to sync it"
    )
    assert gone.calls == []
    missing = Runner(raises=FileNotFoundError(2, "No such file or directory"))
    assert sync_folder(INTO, str(tmp_path), time.monotonic() + 3, environ={}, runner=missing) == (
        "wandb sync could not start (No such file or directory)"
    )


def test_a_log_that_ends_inside_a_record_is_cut_before_its_sync_and_the_cut_told(
    offline_run: dict[str, Any], tmp_path: Path
) -> None:
    run = tmp_path / "wandb" / "run-20261206_000000-r1"  # an online writer's folder, its relay dead
    run.mkdir(parents=True)
    data = offline_run["files"]["node-primary-aaaaaa"].read_bytes()
    (run / "run-r1.wandb").write_bytes(data[:BLOCK_SIZE])  # its last block never written out
    told: list[tuple[str, int]] = []
    runner = Runner()
    assert (
        sync_folder(
            INTO, str(tmp_path), time.monotonic() + 30, environ={}, runner=runner, on_cut=lambda *a: told.append(a)
        )
        is None
    )
    ((log, cut),) = told
    assert log == str(run / "run-r1.wandb") and cut == BLOCK_SIZE - (run / "run-r1.wandb").stat().st_size > 0
    assert read_run(log).error is None and len(runner.calls) == 1
