"""The primary writer's queue carries typed commands, answered by type: each command type, sent
through the writer's public method, does what it says to the run (a table: command -> what the
run received), and no command type is left without an answer."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._console import ConsoleLine, Stream
from ray_wandb_nodes._failure import FailureNotice, FailureSummary
from ray_wandb_nodes._hang import HangNotice
from ray_wandb_nodes._health import Alert, EventKind
from ray_wandb_nodes._run import primary as _primary
from ray_wandb_nodes._run.primary import PrimaryWriter
from ray_wandb_nodes._run.primary_commands import (
    Finish,
    LogArtifact,
    LogHealth,
    LogRanks,
    LogReport,
    PrimaryCommand,
    RaiseAlert,
    RecordFailure,
    RecordHang,
    UpdateConfig,
    WriteConsole,
)
from ray_wandb_nodes._run.run_writes import RunWrites
from ray_wandb_nodes._warn import Warner
from tests.support.wait import wait_until


class FakeRun:
    """What the writer thread calls on a wandb run, recorded in order as (call, what)."""

    entity, project, offline = "team", "proj", True  # offline: no watch of artifact uploads
    summary: dict[str, Any] = {}

    def __init__(self, folder: Path) -> None:
        self.dir = str(folder)
        self.calls: list[tuple[str, Any]] = []
        self.config = self  # run.config.update(...)

    def update(self, config: dict[str, Any], allow_val_change: bool = False) -> None:
        self.calls.append(("config", dict(config)))

    def log(self, row: dict[str, Any]) -> None:
        self.calls.append(("log", sorted(row)))

    def alert(self, title: str, text: str, level: str, wait_duration: float) -> None:
        self.calls.append(("alert", (title, level)))

    def save(self, path: str, base_path: str, policy: str) -> None:
        self.calls.append(("save", Path(path).relative_to(base_path).as_posix()))

    def log_artifact(self, artifact: Any, aliases: list[str] | None = None) -> Any:
        self.calls.append(("artifact", (artifact, aliases)))
        return artifact

    def write_logs(self, text: str) -> None:
        self.calls.append(("console", text))

    def finish(self, exit_code: int) -> None:
        self.calls.append(("finish", exit_code))


def _spec() -> Any:
    from ray_wandb_nodes._config.options import build_options
    from ray_wandb_nodes._config.secrets import CapturedEnv
    from ray_wandb_nodes._config.values import Mode
    from ray_wandb_nodes._wandb.writers import primary_spec

    options = build_options(project="proj")
    env = CapturedEnv(base_url="http://127.0.0.1:9", project="proj")
    return primary_spec(
        options, env, mode=Mode.ONLINE, run_id="run-1", label="node-head-0", display_name="run",
        group=None, config={}, default_dir="/tmp",
    )  # fmt: skip


ALERT = Alert("Node lost", "node-a left", "ERROR", "node-a", EventKind.NODE_LOST)
HANG = HangNotice(1, "Hang", "rank 1 stopped", "ERROR", files=(("rank-1.txt", "stack"),))
FAILURE = FailureNotice(
    2, "Attempt 2: Rank 1 failed: ValueError: x", "Rank 1 on node-a raised ValueError: x", "ERROR",
    FailureSummary(2, "raised", "ValueError: x", 1, "node-a"), files=(("rank-1.txt", "Traceback"),),
)  # fmt: skip

# command type -> (how the writer's public method sends it, what the run receives)
CASES: dict[type, tuple[Callable[[PrimaryWriter], None], list[tuple[str, Any]]]] = {
    LogReport: (lambda p: p.log({"loss": 1.0}), [("log", ["loss", "training_iteration"])]),
    UpdateConfig: (lambda p: p.update_config({"lr": 0.1}), [("config", {"lr": 0.1})]),
    LogArtifact: (
        lambda p: p.log_artifact(lambda wandb: "built", aliases=["latest"]),
        [("artifact", ("built", ["latest"]))],
    ),
    RaiseAlert: (lambda p: p.alert(ALERT), [("alert", ("Node lost", "ERROR"))]),
    RecordHang: (lambda p: p.hang(HANG), [("alert", ("Hang", "ERROR")), ("save", "hangs/hang-1/rank-1.txt")]),
    RecordFailure: (
        lambda p: p.failure(FAILURE),
        [("alert", ("Attempt 2: Rank 1 failed: ValueError: x", "ERROR")), ("save", "failures/attempt-2/rank-1.txt")],
    ),
    LogHealth: (lambda p: p.log_health(2, None), [("log", ["nodes/stragglers", "training_iteration"])]),
    WriteConsole: (lambda p: p.console_lines([ConsoleLine(0, Stream.ERR, "hello")]), [("console", "[rank 0] hello")]),
    LogRanks: (lambda p: p.log_ranks({"ranks/slow": 1.0}, None), [("log", ["ranks/slow", "training_iteration"])]),
    Finish: (lambda p: p.request_finish(3), [("finish", 3)]),
}


def test_every_command_type_has_a_case() -> None:
    assert set(CASES) == set(typing.get_args(PrimaryCommand))


@pytest.mark.parametrize("kind", list(CASES), ids=lambda k: k.__name__)
def test_each_command_does_what_it_says_to_the_run(kind: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(tmp_path)
    monkeypatch.setattr(_primary, "init_writer", lambda spec: run)
    primary = PrimaryWriter(_spec(), warner=Warner())
    primary.start()
    send, received = CASES[kind]
    send(primary)
    primary.request_finish(3)  # a second finish does nothing
    assert primary.wait_done(10)
    expected = received if kind is Finish else [*received, ("finish", 3)]
    assert run.calls == expected


def test_without_a_run_reports_are_counted_dropped_and_artifacts_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(spec: Any) -> Any:
        raise ConnectionError("W&B is unreachable")

    monkeypatch.setattr(_primary, "init_writer", refused)
    primary = PrimaryWriter(_spec(), warner=Warner())
    primary.start()
    for kind, (send, _) in CASES.items():
        if kind is not Finish:
            send(primary)
    # the artifact thread builds it and hands it over: settled unlogged, not left pending
    wait_until(lambda: primary.failed and not primary._uploads.pending, 10, "the artifact settled", every_s=0.01)
    primary.request_finish(3)
    assert primary.wait_done(10)
    assert primary.dropped == 1 and primary.run is None and primary.exit_code == 3


def test_a_value_that_is_no_command_is_refused_by_name() -> None:
    primary = PrimaryWriter(_spec(), warner=Warner())
    primary._writes = object.__new__(RunWrites)  # a run exists
    with pytest.raises(TypeError, match="no answer to 'log'"):
        primary._handle("log")  # type: ignore[arg-type]  # the untyped queue's old kind
