"""The ranks' lines into a run, through the real wandb client and the test backend over HTTP: a
node writer as the node loggers start one (shared mode, not the primary, ``console="off"``, its
node's label) writes them; the run's console has each line labelled by the node and the rank, in
the legacy format and the structured one, and none of the writer's own process output."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ray_wandb_nodes._console import (
    ConsoleLine,
    ConsoleTailer,
    Kind,
    RankProcess,
    RunConsole,
    Stream,
    plan_console,
)
from tests.support.env import FAST
from tests.support.runs import unique
from tests.support.wait import wait_until
from tests.support.wandb_backend import ConsoleLogLine, WandbTestBackend

WAIT_S = 60.0  # a writer's start and finish on 2 loaded cores: seconds, waited on as events


@pytest.fixture
def node_writer(backend: WandbTestBackend) -> Iterator[Any]:
    import wandb

    run = wandb.init(
        project="console",
        id=unique("console"),
        settings=wandb.Settings(
            mode="shared", x_primary=False, x_update_finish_state=False, x_label="node-1", console="off", **FAST
        ),
    )
    yield run
    run.finish()


def console_of(backend: WandbTestBackend, run: Any) -> list[ConsoleLogLine]:
    run.finish()  # every line sent
    return backend.run(run.id).console()


LINES = [
    ConsoleLine(0, Stream.ERR, "epoch 1: loss 0.5"),
    ConsoleLine(3, Stream.ERR, "Traceback (most recent call last):"),
    ConsoleLine(3, Stream.ERR, "ValueError: bad shard 17"),
    ConsoleLine(3, Stream.ERR, "1,234 earlier lines not kept; its last 200 follow", Kind.NOTE),
]
TEXTS = [
    "[rank 0] epoch 1: loss 0.5",
    "[rank 3] Traceback (most recent call last):",
    "[rank 3] ValueError: bad shard 17",
    "[rank 3] ray_wandb_nodes: 1,234 earlier lines not kept; its last 200 follow",
]


def test_lines_reach_the_run_labelled_by_node_and_rank_and_the_writer_s_own_output_stays_out(
    backend: WandbTestBackend, node_writer: Any
) -> None:
    RunConsole(node_writer)(LINES)
    print("the node logger's own output")
    lines = console_of(backend, node_writer)
    assert [(x.label, x.level, x.text) for x in lines] == [("node-1", None, t) for t in TEXTS]
    assert not backend.run(node_writer.id).files  # no output_<label>.log of the writer's console


def test_where_the_server_takes_structured_console_logs_each_line_carries_the_node_label(
    backend: WandbTestBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb

    monkeypatch.setattr(backend, "features", {"STRUCTURED_CONSOLE_LOGS"})
    run = wandb.init(
        project="console",
        id=unique("structured"),
        settings=wandb.Settings(
            mode="shared", x_primary=False, x_update_finish_state=False, x_label="node-2", console="off", **FAST
        ),
    )
    RunConsole(run)(LINES)
    lines = console_of(backend, run)
    assert [(x.structured, x.label, x.text) for x in lines] == [(True, "node-2", t) for t in TEXTS]


def test_before_wandb_0_28_2_each_line_goes_alone_without_a_blank_line(
    backend: WandbTestBackend, node_writer: Any
) -> None:
    # 0.28.0 and 0.28.1 keep write_logs' newline in the line: the sender sends each line alone
    # through the writer's interface instead (this wandb, told it is 0.28.1, takes that path).
    RunConsole(node_writer, wandb_version="0.28.1")(LINES)
    lines = console_of(backend, node_writer)
    assert [x.text for x in lines] == TEXTS


def test_many_lines_arrive_all_and_in_order(backend: WandbTestBackend, node_writer: Any) -> None:
    sink = RunConsole(node_writer)
    many = [ConsoleLine(1, Stream.OUT, f"line {i:05d} " + "x" * 200) for i in range(3_000)]
    sink(many[:1_000])
    sink(many[1_000:])
    lines = console_of(backend, node_writer)
    assert [x.text for x in lines] == [f"[rank 1] {x.text}" for x in many]


def test_a_rank_that_raises_has_its_traceback_in_the_run_from_its_node_s_writer(
    backend: WandbTestBackend, node_writer: Any, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.console_rank", str(tmp_path), str(tmp_path / "go"), "raise"]
    )
    try:
        wait_until(lambda: (tmp_path / f"{proc.pid}.started").exists(), WAIT_S, "the rank process to start")
        tailer = ConsoleTailer(plan_console("rank0", 4, 2), tmp_path, RunConsole(node_writer), poll_s=0.05).start()
        tailer.watch([RankProcess(3, proc.pid)])
        (tmp_path / "go").touch()
        proc.wait(WAIT_S)
        tailer.end_attempt(failed=True)
        assert tailer.finish(failed=True, timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Its stdout and stderr are two files, read apart: a line of one may fall between two reads of
    # the other's traceback (seen on 2 loaded cores). The traceback itself comes whole, in order.
    stdout = {"[rank 3] stdout line of its own", "[rank 3] about to fail"}
    texts = [x.text for x in console_of(backend, node_writer) if x.label == "node-1" and x.text not in stdout]
    start, end = (
        texts.index("[rank 3] Traceback (most recent call last):"),
        texts.index("[rank 3] ValueError: bad shard 17"),
    )
    assert start < end and all(x.startswith("[rank 3]   ") for x in texts[start + 1 : end]), texts[start:end]
    assert "[rank 3] 100%|##########|" in texts
