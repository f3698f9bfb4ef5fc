"""The ranks' console in a node logger (``_fleet/node_console.py``), through the real ``NodeLogger``
class in this process (no Ray; its writer a stand-in for wandb's run that records what it is
asked) and real rank processes writing Ray's worker files (``tests/support/console_rank.py``):
ranks told before the writer's join wait for it; rank 0's lines go live through ``write_logs``;
a failed attempt's end brings a rank's last lines and traceback; a failed run's finish brings
them before the writer's own finish, and a healthy run's leaves them out."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from ray_wandb_nodes import _ray
from ray_wandb_nodes._console import RankProcess, plan_console
from ray_wandb_nodes._fleet import node_logger
from ray_wandb_nodes._fleet.node_logger import NodeLogger
from ray_wandb_nodes._fleet.wire import ConsoleEnd, ConsoleRanks
from ray_wandb_nodes._wandb.writers import WriterSpec
from tests.support.wait import wait_until

WAIT_S = 30.0  # a process's start and end on 2 loaded cores: seconds at worst, waited on as events


class Run:
    """What the logger asks of a wandb run, in order: its console lines and its finish."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.summary: dict[str, Any] = {}
        self._lock = threading.Lock()

    def write_logs(self, text: str) -> None:
        with self._lock:
            self.events += text.split("\n")

    def finish(self, exit_code: int | None = None) -> None:
        with self._lock:
            self.events.append("<finish>")

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.events)


@pytest.fixture
def logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "logs"
    folder.mkdir()
    monkeypatch.setattr(_ray, "logs_dir", lambda: str(folder))
    yield folder


@pytest.fixture
def logger(tmp_path: Path, logs: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[NodeLogger, Run]]:
    run = Run()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1"))
    monkeypatch.setattr(node_logger, "node_dir", lambda *args, **kwargs: str(tmp_path / "wandb"))
    monkeypatch.setattr(node_logger, "init_writer", lambda spec, **_: run)
    yield NodeLogger(root=tmp_path), run


@pytest.fixture
def procs(logs: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def rank(logs: Path, procs: list[subprocess.Popen[bytes]], end: str) -> int:
    """A rank's process writing Ray's worker files in ``logs``; it ends as ``end`` says on ``go``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.console_rank", str(logs), str(logs / "go"), end]
    )  # fmt: skip
    procs.append(proc)
    wait_until(lambda: (logs / f"{proc.pid}.started").exists(), WAIT_S, f"rank process {proc.pid} to start")
    return proc.pid


def spec() -> WriterSpec:
    settings = {"x_stats_sampling_interval": 60}
    return WriterSpec(role="node", label="node-a", init_kwargs={"id": "run-1"}, settings=settings)


def start(logger: NodeLogger, logs: Path, procs: list[subprocess.Popen[bytes]]) -> tuple[int, int]:
    """Ranks 0 (ends well) and 1 (raises), told before the writer's join; then the join."""
    pids = rank(logs, procs, "ok"), rank(logs, procs, "raise")
    ranks = ConsoleRanks("run-1", (RankProcess(0, pids[0]), RankProcess(1, pids[1])), plan_console("rank0", 2, 1))
    logger.console(ranks)  # before the join: kept for it
    logger.add_writer(spec())
    return pids


def go(logs: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    (logs / "go").touch()
    for proc in procs:
        proc.wait(WAIT_S)


def test_a_failed_attempts_end_brings_a_ranks_last_lines_and_traceback(
    logger: tuple[NodeLogger, Run], logs: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    node, run = logger
    pids = start(node, logs, procs)
    wait_until(lambda: f"[rank 0] hello from pid {pids[0]}" in run.seen(), WAIT_S, "rank 0's line, live")
    assert not [line for line in run.seen() if line.startswith("[rank 1]")]  # kept back while it lives
    go(logs, procs)
    node.console_end(ConsoleEnd("run-1", failed=True))
    wait_until(lambda: "[rank 1] ValueError: bad shard 17" in run.seen(), WAIT_S, "rank 1's traceback")
    rank1 = [line for line in run.seen() if line.startswith("[rank 1]")]
    traceback = rank1.index("[rank 1] Traceback (most recent call last):")
    assert rank1.index(f"[rank 1] hello from pid {pids[1]}") < traceback
    node.finish("run-1", exit_code=0)
    assert run.seen()[-1] == "<finish>" and run.seen().count("[rank 1] ValueError: bad shard 17") == 1


@pytest.mark.parametrize(("exit_code", "sent"), [(1, True), (0, False)], ids=["failed", "healthy"])
def test_the_writers_finish_hands_the_last_lines_over_first_when_the_run_failed(
    logger: tuple[NodeLogger, Run], logs: Path, procs: list[subprocess.Popen[bytes]], exit_code: int, sent: bool
) -> None:
    node, run = logger
    pids = start(node, logs, procs)
    wait_until(lambda: f"[rank 0] hello from pid {pids[0]}" in run.seen(), WAIT_S, "rank 0's line, live")
    go(logs, procs)
    node.finish("run-1", exit_code=exit_code)  # no attempt's end came: the run's finish ends the console
    seen = run.seen()
    assert seen[-1] == "<finish>" and seen.count("<finish>") == 1
    assert ("[rank 1] ValueError: bad shard 17" in seen) is sent, seen
    assert seen.index("[rank 0] the last line, exit 0") < seen.index("<finish>")  # rank 0's last, live


def test_last_words_pushed_out_of_the_tail_are_found_further_back(tmp_path: Path, monkeypatch: Any) -> None:
    from ray_wandb_nodes._failure import read_last_words
    from ray_wandb_nodes._fleet import node_console

    watchdog = (
        "[rank4]:[E1206 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 4] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
        "for 600067 milliseconds before timing out.\n"
    )
    dump = "".join(f'  File "/opt/lib/site-packages/x.py", line {i}, in thread_{i}\n' for i in range(4000))
    (tmp_path / "worker-ab-01-4242.err").write_text(watchdog + dump)  # the crash dump after it: ~250 KB
    monkeypatch.setattr(node_console._ray, "logs_dir", lambda: str(tmp_path))
    words = read_last_words(node_console.last_words(4242))
    assert words.by == "NCCL's watchdog" and words.watchdog is not None and words.watchdog.seq == 1580
    (tmp_path / "worker-ab-01-4243.err").write_text(dump)  # a SIGKILL prints nothing: nothing found
    assert not read_last_words(node_console.last_words(4243)).found


def test_a_node_whose_ray_writes_no_log_files_says_so_and_reads_no_console() -> None:
    from bench.fleet_scale import Quiet
    from ray_wandb_nodes._fleet.node_console import ray_logs

    warner = Quiet()
    assert ray_logs(lambda: "/tmp/ray/session_latest/logs", warner, "this node") == "/tmp/ray/session_latest/logs"  # type: ignore[arg-type]
    assert warner.said == []  # a folder: nothing to say
    assert ray_logs(lambda: None, warner, "the Train controller's node") is None  # type: ignore[arg-type]
    assert warner.said == [
        "the Train controller's node has no Ray log folder (RAY_LOG_TO_STDERR=1 writes no files): its ranks' "
        "console is not in the run"
    ]
